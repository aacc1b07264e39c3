#pragma once
// RMSNorm, SwiGLU and RoPE kernels (launched by gpu/cuda/elementwise.cu's host functions).
#include <cstdint>

namespace tireless::cuda::detail {

// One block per row; blockDim.x threads (a multiple of 32, at most 1024).
__global__ void rms_norm_kernel(const float* x, const float* w, float* out, int32_t n, float eps);
__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n);
// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos,
                            float base);

}  // namespace tireless::cuda::detail
