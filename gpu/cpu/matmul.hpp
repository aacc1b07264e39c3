#pragma once
// Matrix products y = x · Wᵀ on the CPU, split over a thread pool by groups of 4 rows.

#include <cstdint>
#include <memory>

#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/packed_matrix.hpp"
#include "gpu/cpu/thread_pool.hpp"

namespace tireless::cpu {

// Room for activations quantized to 8 bits; sized once, reused every step.
class q8_buffer {
 public:
  q8_buffer() = default;
  q8_buffer(int64_t max_rows, int64_t max_cols);

  // Quantizes n rows of `cols` floats (row stride ldx), split over the pool.
  q8_view quantize(thread_pool& pool, const isa_kernels& k, const float* x, int64_t n,
                   int64_t cols, int64_t ldx);

 private:
  struct free_aligned {
    void operator()(void* p) const;
  };
  int64_t max_rows_ = 0;
  int64_t max_pairs_ = 0;
  std::unique_ptr<int8_t[], free_aligned> q_;
  std::unique_ptr<float[], free_aligned> d_;
  std::unique_ptr<float[], free_aligned> s_;
};

// y[t * ldy + r] = Σ_c W[r][c] · x[t][c] for t < n and every row r of w. Quantized weights
// read xq (x quantized with q8_buffer); float weights read x (row stride ldx).
void matmul(thread_pool& pool, const isa_kernels& k, const packed_matrix& w, const float* x,
            int64_t ldx, const q8_view* xq, int64_t n, float* y, int64_t ldy);

}  // namespace tireless::cpu
