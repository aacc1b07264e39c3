#pragma once
// ggml's block formats read on the device (the layouts of gpu/tensor_type.hpp): 32 elements a
// block; q4_0 = fp16 d, 16 bytes of nibbles (element e in the low nibble of byte e, element
// 16 + e in its high nibble), value (q - 8) d; q4_1 = fp16 d, fp16 m, 16 bytes, value q d + m;
// q8_0 = fp16 d, 32 int8, value q d. Float types: one element each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/tensor_type.hpp"

namespace tireless::cuda::detail {

__device__ __forceinline__ float half_at(const uint8_t* p) {
  const uint16_t bits = static_cast<uint16_t>(p[0]) | static_cast<uint16_t>(p[1]) << 8;  // blocks are 2-byte aligned at best
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float bf16_at(const uint8_t* p) {
  const uint32_t bits = (static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8) << 16;
  return __uint_as_float(bits);
}

// The 32 values of block `b` of a row, into v[32].
template <tensor_type T>
__device__ __forceinline__ void load_block(const uint8_t* row, int64_t b, float* v) {
  if constexpr (T == tensor_type::q4_0) {
    const uint8_t* blk = row + b * 18;
    const float d = half_at(blk);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = (static_cast<int>(blk[2 + e] & 0x0F) - 8) * d;
      v[e + 16] = (static_cast<int>(blk[2 + e] >> 4) - 8) * d;
    }
  } else if constexpr (T == tensor_type::q4_1) {
    const uint8_t* blk = row + b * 20;
    const float d = half_at(blk), m = half_at(blk + 2);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = static_cast<float>(blk[4 + e] & 0x0F) * d + m;
      v[e + 16] = static_cast<float>(blk[4 + e] >> 4) * d + m;
    }
  } else if constexpr (T == tensor_type::q8_0) {
    const uint8_t* blk = row + b * 34;
    const float d = half_at(blk);
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = static_cast<float>(static_cast<int8_t>(blk[2 + e])) * d;
  } else if constexpr (T == tensor_type::f16) {
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = half_at(row + (b * 32 + e) * 2);
  } else if constexpr (T == tensor_type::bf16) {
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = bf16_at(row + (b * 32 + e) * 2);
  } else {
    const float* f = reinterpret_cast<const float*>(row);
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = f[b * 32 + e];
  }
}

// Bytes of a row of `cols` elements (cols a multiple of 32 for the block types).
__host__ __device__ inline int64_t row_bytes_of(tensor_type t, int64_t cols) {
  switch (t) {
    case tensor_type::q4_0: return cols / 32 * 18;
    case tensor_type::q4_1: return cols / 32 * 20;
    case tensor_type::q8_0: return cols / 32 * 34;
    case tensor_type::f16:
    case tensor_type::bf16: return cols * 2;
    case tensor_type::f32: return cols * 4;
  }
  return 0;
}

}  // namespace tireless::cuda::detail
