#pragma once
// The products of decode: up to matvec_max_tokens tokens times a weight matrix, the weights read
// once for all of them (gpu/cuda/matvec.cu). A warp takes two rows (four from 3 tokens on); its
// lanes take the rows' 32-value blocks in turn, two blocks in flight, each block's quants one
// 16-byte load (q8_0: two); the tokens' activations are staged in shared memory a chunk of
// columns at a time (shapes.hpp, plan_matvec: under ~28 KiB a block at any token count), and
// each chunk's first weights are loaded before the barrier that ends its staging. Quantized
// weights meet int8 activations (dp4a), float weights f32 activations. Grouped (MoE):
// blockIdx.y is a tile of up to 1, 2, 4 or 8 pairs of one expert, found in the groups' offsets,
// so that an expert's rows are read once per tile, not once per pair.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda/ops.hpp"

namespace tireless::cuda::detail {

// Launches y (+)= W x for n <= matvec_max_tokens tokens (grouped: n pairs sorted by group,
// any n); false where the launch cannot be made (more tiles than a grid's rows; the caller then
// takes the matrix-matrix path).
bool launch_matvec(const device_matrix& w, const float* x, int64_t ldx, const q8_rows* xq, int32_t n, float* y,
                   int64_t ldy, bool accumulate, const int32_t* offsets, int32_t groups, int64_t rows_per_group,
                   cudaStream_t s);

// The device's multiprocessors (cached per device).
int multiprocessors();

}  // namespace tireless::cuda::detail
