#include "gpu/cpu/matmul.hpp"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <new>

namespace tireless::cpu {

namespace {

template <class T>
T* aligned_array(int64_t n) {
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<T*>(p);
}

}  // namespace

void q8_buffer::free_aligned::operator()(void* p) const { std::free(p); }

q8_buffer::q8_buffer(int64_t max_rows, int64_t max_cols)
    : max_rows_(max_rows),
      max_blocks_((max_cols + block_cols - 1) / block_cols),
      q_(aligned_array<int8_t>(max_rows * max_blocks_ * block_cols)),
      d_(aligned_array<float>(max_rows * max_blocks_)),
      s_(aligned_array<float>(max_rows * max_blocks_)),
      qsum_(aligned_array<int32_t>(max_rows * max_blocks_)) {}

q8_view q8_buffer::quantize(thread_pool& pool, const isa_kernels& k, const float* x, int64_t n,
                            int64_t cols, int64_t ldx) {
  const int64_t blocks = (cols + block_cols - 1) / block_cols;
  assert(n <= max_rows_ && blocks <= max_blocks_);
  int8_t* q = q_.get();
  float* d = d_.get();
  float* s = s_.get();
  int32_t* qsum = qsum_.get();
  // Quantizing a row takes well under a microsecond: split only long batches.
  const int64_t grain = std::max<int64_t>(32, n / (4 * pool.size()));
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    k.quantize_rows(x + b * ldx, e - b, cols, ldx, q + b * blocks * block_cols, d + b * blocks,
                    s + b * blocks, qsum + b * blocks, blocks);
  });
  return q8_view{q, d, s, qsum, blocks};
}

void matmul(thread_pool& pool, const isa_kernels& k, std::span<const matmul_job> jobs, int64_t n) {
  // Tasks are the row groups of all jobs, numbered job after job.
  int64_t total = 0;
  for (const matmul_job& j : jobs) total += j.w->groups();
  // Enough chunks per thread to even out, few enough to keep the hand-out cheap.
  const int64_t grain = std::max<int64_t>(1, total / (8 * pool.size()));
  pool.parallel_for(total, grain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const matmul_job& j : jobs) {
      const int64_t groups = j.w->groups();
      const int64_t g0 = std::max(begin - first, int64_t{0}), g1 = std::min(end - first, groups);
      if (g0 < g1) {
        if (j.w->quantized()) {
          assert(j.xq && j.xq->blocks == j.w->blocks());
          k.matmul_q(*j.w, *j.xq, n, g0, g1, j.y, j.ldy, j.accumulate);
        } else {
          k.matmul_f(*j.w, j.x, j.ldx, n, g0, g1, j.y, j.ldy, j.accumulate);
        }
      }
      first += groups;
    }
  });
}

}  // namespace tireless::cpu
