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
      max_pairs_((max_cols + pair_cols - 1) / pair_cols),
      q_(aligned_array<int8_t>(max_rows * max_pairs_ * pair_cols)),
      d_(aligned_array<float>(max_rows * max_pairs_ * 2)),
      s_(aligned_array<float>(max_rows * max_pairs_ * 2)) {}

q8_view q8_buffer::quantize(thread_pool& pool, const isa_kernels& k, const float* x, int64_t n,
                            int64_t cols, int64_t ldx) {
  const int64_t pairs = (cols + pair_cols - 1) / pair_cols;
  assert(n <= max_rows_ && pairs <= max_pairs_);
  int8_t* q = q_.get();
  float* d = d_.get();
  float* s = s_.get();
  const int64_t grain = std::max<int64_t>(1, n / (4 * pool.size()));
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    k.quantize_rows(x + b * ldx, e - b, cols, ldx, q + b * pairs * pair_cols, d + b * pairs * 2,
                    s + b * pairs * 2, pairs);
  });
  return q8_view{q, d, s, pairs};
}

void matmul(thread_pool& pool, const isa_kernels& k, const packed_matrix& w, const float* x,
            int64_t ldx, const q8_view* xq, int64_t n, float* y, int64_t ldy) {
  const int64_t groups = w.groups();
  // Enough chunks per thread to even out, few enough to keep the hand-out cheap.
  const int64_t grain = std::max<int64_t>(1, groups / (8 * pool.size()));
  if (w.quantized()) {
    assert(xq && xq->pairs == w.pairs());
    pool.parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
      k.matmul_q(w, *xq, n, g0, g1, y, ldy);
    });
  } else {
    pool.parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
      k.matmul_f(w, x, ldx, n, g0, g1, y, ldy);
    });
  }
}

}  // namespace tireless::cpu
