#include "gpu/cuda/device.cuh"
#include "gpu/cuda/moe.cuh"
#include "gpu/cuda/ops.hpp"

#include <cub/block/block_scan.cuh>

#include <stdexcept>
#include <string>

namespace tireless::cuda {

namespace detail {
namespace {

// One warp per row. Expert j of the top k: the highest logit among those not chosen yet, the
// lower index on ties; gate_j = e^(logit_j - top) / Σ over the k.
__global__ void route_kernel(const float* logits, int32_t rows, int32_t n_expert, int32_t k, const int32_t* row_seq,
                             int32_t* chosen, float* gates, unsigned long long* counts) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const float* l = logits + r * n_expert;
  int picked[moe_max_used];
  float g[moe_max_used];
  float top = 0.0f, sum = 0.0f;
#pragma unroll
  for (int j = 0; j < moe_max_used; ++j) picked[j] = -1;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int at = 0x7fffffff;
    for (int x = lane; x < n_expert; x += 32) {
      bool taken = false;
#pragma unroll
      for (int q = 0; q < moe_max_used; ++q) taken |= q < j && picked[q] == x;
      if (taken) continue;
      const float v = l[x];
      if (at == 0x7fffffff || v > best) best = v, at = x;  // lanes scan upwards: the first of equals stays
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, off);
      const int i = __shfl_xor_sync(0xffffffffu, at, off);
      if (i != 0x7fffffff && (at == 0x7fffffff || v > best || (v == best && i < at))) best = v, at = i;
    }
#pragma unroll
    for (int q = 0; q < moe_max_used; ++q) {
      if (q == j) picked[q] = at;
    }
    if (j == 0) top = best;
    const float gate = expf(best - top);
#pragma unroll
    for (int q = 0; q < moe_max_used; ++q) {
      if (q == j) g[q] = gate;
    }
    sum = __fadd_rn(sum, gate);
  }
  if (lane != 0) return;
  const bool counted = counts && (!row_seq || row_seq[r] >= 0);
#pragma unroll
  for (int q = 0; q < moe_max_used; ++q) {
    if (q >= k) break;
    chosen[r * k + q] = picked[q];
    gates[r * k + q] = __fdiv_rn(g[q], sum);
    if (counted) atomicAdd(counts + picked[q], 1ull);
  }
}

// One block of 1024 threads: counts per expert, their exclusive scan (the offsets), then each
// slot's place among its expert's pairs.
__global__ void __launch_bounds__(1024) group_kernel(const int32_t* chosen, int32_t slots, int32_t k, int32_t n_expert,
                                                     int32_t* offsets, int32_t* pair_row, int32_t* slot_pair) {
  __shared__ int count[moe_max_experts];
  using scan = cub::BlockScan<int, 1024>;
  __shared__ typename scan::TempStorage temp;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&count[chosen[s]], 1);
  __syncthreads();
  const int mine = threadIdx.x < n_expert ? count[threadIdx.x] : 0;
  int first = 0, total = 0;
  scan(temp).ExclusiveSum(mine, first, total);
  __syncthreads();
  if (threadIdx.x < n_expert) {
    offsets[threadIdx.x] = first;
    count[threadIdx.x] = first;  // from here on: the next free place of each expert
  }
  if (threadIdx.x == 0) offsets[n_expert] = total;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int p = atomicAdd(&count[chosen[s]], 1);
    slot_pair[s] = p;
    pair_row[p] = s / k;
  }
}

// One block per row: x += Σ_j gate_j · y[pair of slot j], the sum first (from 0, j in order),
// then the residual add, each step rounded, as the CPU's combine_slots and its add.
__global__ void combine_kernel(const float* y, int64_t ldy, const int32_t* slot_pair, const float* gates, int32_t k,
                               int64_t n, float* x, int64_t ldx) {
  const int64_t r = blockIdx.x;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t s = r * k + j;
      sum = __fadd_rn(sum, __fmul_rn(gates[s], y[slot_pair[s] * ldy + c]));
    }
    x[r * ldx + c] = __fadd_rn(x[r * ldx + c], sum);
  }
}

__global__ void gather_kernel(const float* src, int64_t lds, const int32_t* row_of, int64_t n, float* dst, int64_t ldd) {
  const int64_t r = blockIdx.x;
  const float* s = src + static_cast<int64_t>(row_of[r]) * lds;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) dst[r * ldd + c] = s[c];
}

}  // namespace
}  // namespace detail

void moe_route(const float* logits, int32_t rows, int32_t n_expert, int32_t k, const int32_t* row_seq, int32_t* chosen,
               float* gates, unsigned long long* counts, void* stream) {
  if (rows <= 0) return;
  if (k < 1 || k > detail::moe_max_used || k > n_expert) {
    throw std::invalid_argument("moe_route: " + std::to_string(k) + " experts a token of " + std::to_string(n_expert) +
                                " (at most " + std::to_string(detail::moe_max_used) + ")");
  }
  const unsigned blocks = static_cast<unsigned>((int64_t{rows} * 32 + 255) / 256);
  detail::route_kernel<<<blocks, 256, 0, detail::stream_of(stream)>>>(logits, rows, n_expert, k, row_seq, chosen, gates, counts);
  detail::check_launch("moe_route");
}

void moe_group(const int32_t* chosen, int32_t rows, int32_t k, int32_t n_expert, int32_t* offsets, int32_t* pair_row,
               int32_t* slot_pair, void* stream) {
  if (n_expert < 1 || n_expert > detail::moe_max_experts) {
    throw std::invalid_argument("moe_group: " + std::to_string(n_expert) + " experts; at most " +
                                std::to_string(detail::moe_max_experts));
  }
  detail::group_kernel<<<1, 1024, 0, detail::stream_of(stream)>>>(chosen, rows * k, k, n_expert, offsets, pair_row, slot_pair);
  detail::check_launch("moe_group");
}

void moe_combine(const float* y, int64_t ldy, const int32_t* slot_pair, const float* gates, int32_t rows, int32_t k,
                 int64_t n, float* x, int64_t ldx, void* stream) {
  if (rows <= 0) return;
  detail::combine_kernel<<<rows, 256, 0, detail::stream_of(stream)>>>(y, ldy, slot_pair, gates, k, n, x, ldx);
  detail::check_launch("moe_combine");
}

void gather_rows(const float* src, int64_t lds, const int32_t* row_of, int32_t rows, int64_t n, float* dst, int64_t ldd,
                 void* stream) {
  if (rows <= 0) return;
  detail::gather_kernel<<<rows, 256, 0, detail::stream_of(stream)>>>(src, lds, row_of, n, dst, ldd);
  detail::check_launch("gather_rows");
}

}  // namespace tireless::cuda
