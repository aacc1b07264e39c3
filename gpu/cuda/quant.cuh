#pragma once
// Weights read on the device in the layout of weight_layout.hpp: a quantized row's quants are
// 16-byte aligned ([nb][16] bytes for q4_0/q4_1: byte j holds element j in its low nibble and
// element j + 16 in its high one; [nb][32] int8 for q8_0), its fp16 scales d (and q4_1
// minimums m) in arrays of their own. Values: q4_0 (q - 8) d, q4_1 q d + m, q8_0 q d.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/cuda/ops.hpp"

namespace tireless::cuda::detail {

__device__ __forceinline__ float half_bits_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

__device__ __forceinline__ float scale_at(const void* p, int64_t i) {
  return half_bits_to_float(__ldg(static_cast<const unsigned short*>(p) + i));
}

template <tensor_type T>
constexpr bool quantized_type = T == tensor_type::q4_0 || T == tensor_type::q4_1 || T == tensor_type::q8_0;

// Bytes of one block's quants.
template <tensor_type T>
constexpr int block_qs_bytes() {
  return T == tensor_type::q8_0 ? 32 : 16;
}

// The 32 values of block b of row r, into v[32], rounded as the CPU's dequantize_row rounds
// them (a product, then a sum: no fused multiply-add).
template <tensor_type T>
__device__ __forceinline__ void dequantize_block(const device_matrix& w, int64_t r, int64_t b, float* v) {
  const int64_t nb = w.cols / 32;
  const auto* qs = static_cast<const uint8_t*>(w.qs) + r * w.qs_row_bytes + b * block_qs_bytes<T>();
  const float d = scale_at(w.d, r * nb + b);
  if constexpr (T == tensor_type::q8_0) {
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = __fmul_rn(static_cast<float>(static_cast<int8_t>(qs[e])), d);
  } else {
    const float m = T == tensor_type::q4_1 ? scale_at(w.m, r * nb + b) : 0.0f;
    const int offset = T == tensor_type::q4_0 ? 8 : 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = __fadd_rn(__fmul_rn(static_cast<float>((qs[e] & 15) - offset), d), m);
      v[e + 16] = __fadd_rn(__fmul_rn(static_cast<float>((qs[e] >> 4) - offset), d), m);
    }
  }
}

// Element c of row r of a float-typed matrix.
template <tensor_type T>
__device__ __forceinline__ float float_element(const device_matrix& w, int64_t r, int64_t c) {
  const auto* row = static_cast<const uint8_t*>(w.qs) + r * w.qs_row_bytes;
  if constexpr (T == tensor_type::f32) return __ldg(reinterpret_cast<const float*>(row) + c);
  if constexpr (T == tensor_type::f16) return half_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + c));
  return bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + c));
}

// The integer dot product of a q4 block's 16 bytes of quants (as 4 words) with a block of 32
// int8 activations (8 words): Σ q_w · q_x, with q_w - 8 for q4_0 (which equals the CPU's
// Σ q_w · q_x - 8 Σ q_x).
template <tensor_type T>
__device__ __forceinline__ int dot_q4(const uint4 w, const int* x) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int lo = static_cast<int>(words[i] & 0x0F0F0F0Fu);         // elements 4i .. 4i + 3
    int hi = static_cast<int>((words[i] >> 4) & 0x0F0F0F0Fu);  // elements 16 + 4i ..
    if constexpr (T == tensor_type::q4_0) {
      lo = static_cast<int>(__vsub4(static_cast<unsigned>(lo), 0x08080808u));
      hi = static_cast<int>(__vsub4(static_cast<unsigned>(hi), 0x08080808u));
    }
    sum = __dp4a(lo, x[i], sum);
    sum = __dp4a(hi, x[4 + i], sum);
  }
  return sum;
}

__device__ __forceinline__ int dot_q8(const uint4 w0, const uint4 w1, const int* x) {
  int sum = __dp4a(static_cast<int>(w0.x), x[0], 0);
  sum = __dp4a(static_cast<int>(w0.y), x[1], sum);
  sum = __dp4a(static_cast<int>(w0.z), x[2], sum);
  sum = __dp4a(static_cast<int>(w0.w), x[3], sum);
  sum = __dp4a(static_cast<int>(w1.x), x[4], sum);
  sum = __dp4a(static_cast<int>(w1.y), x[5], sum);
  sum = __dp4a(static_cast<int>(w1.z), x[6], sum);
  return __dp4a(static_cast<int>(w1.w), x[7], sum);
}

}  // namespace tireless::cuda::detail
