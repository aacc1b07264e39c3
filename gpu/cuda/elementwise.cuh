#pragma once
// Device helpers of the elementwise family (gpu/cuda/elementwise.cu), shared with the kernels
// that fuse them: the 8-bit quantization of one 32-value block by a warp, RoPE's angles and
// turn, with the CPU backend's roundings.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda/device.cuh"

namespace tireless::cuda::detail {

// Lane l holds value l of a block; writes q[l], and (lane 0) *d and *s, as the CPU's
// quantize_rows: d = max|v| / 127, q = rint(v · 127 / max|v|), s = d · Σq.
__device__ __forceinline__ void quantize_block_warp(float v, int8_t* q, float* d, float* s) {
  const int lane = threadIdx.x % 32;
  const float amax = warp_max(fabsf(v));
  const float scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int qi = __float2int_rn(__fmul_rn(v, inv));
  q[lane] = static_cast<int8_t>(qi);
  const int sum = warp_sum(qi);
  if (lane == 0) {
    *d = scale;
    *s = __fmul_rn(scale, static_cast<float>(sum));
  }
}

// cos and sin of pos · base^(-2i / rope_dims): the angle in double, as the CPU backend's lay_out.
__device__ __forceinline__ void rope_angle(int32_t pos, int32_t i, int32_t rope_dims, float base, float* c, float* s) {
  const double theta = pos * pow(static_cast<double>(base), -2.0 * i / rope_dims);
  double sd, cd;
  sincos(theta, &sd, &cd);
  *c = static_cast<float>(cd);
  *s = static_cast<float>(sd);
}

// (a, b) turned by the angle whose cosine and sine are c and s, rounded as the CPU rounds it
// (products, then the sum: no fused multiply-add).
__device__ __forceinline__ void rope_turn(float* pair, float c, float s) {
  const float a = pair[0], b = pair[1];
  pair[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  pair[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

__device__ __forceinline__ float silu_times(float g, float u) {
  const float e = expf(-fabsf(g));
  const float sigmoid = g >= 0.0f ? __fdiv_rn(1.0f, __fadd_rn(1.0f, e)) : __fdiv_rn(e, __fadd_rn(1.0f, e));
  return __fmul_rn(__fmul_rn(g, sigmoid), u);
}

}  // namespace tireless::cuda::detail
