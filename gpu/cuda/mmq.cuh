#pragma once
// The products of prefill for quantized weights: int8 tensor cores (mma.sync m16n8k32, s8 x s8
// into s32) on the weights' own quants and the activations quantized as the CPU quantizes
// them (gpu/cuda/mmq.cu). One 32-value block is one mma k-step, so each block's integer sums
// come out whole and are scaled as the CPU scales them: acc += isum · (d_w · d_x) (+ m_w · s_x
// for q4_1), block after block, per (row, token) in one thread: the CPU's arithmetic, in its
// order.
//
// Tiles: 64 weight rows x 64 tokens a block of 4 warps (each 32 x 32: 2 x 4 mma tiles), 4
// quant blocks (128 columns) a stage, two stages in flight (cp.async for quants, registers for
// scales). Grouped (MoE): blockIdx.y counts the token tiles of every group in turn.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda/ops.hpp"

namespace tireless::cuda::detail {

inline constexpr int mmq_rows = 64, mmq_tokens = 64, mmq_stage_blocks = 4, mmq_threads = 128;

// y (+)= W x for n tokens (grouped: n pairs sorted by group, offsets[groups + 1]).
void launch_mmq(const device_matrix& w, const q8_rows& xq, int32_t n, float* y, int64_t ldy, bool accumulate,
                const int32_t* offsets, int32_t groups, int64_t rows_per_group, cudaStream_t s);

}  // namespace tireless::cuda::detail
