#pragma once
// Matrix products y = x · Wᵀ on the CPU, split over a thread pool by groups of 4 rows.

#include <cstdint>
#include <memory>
#include <span>

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
  int64_t max_blocks_ = 0;
  std::unique_ptr<int8_t[], free_aligned> q_;
  std::unique_ptr<float[], free_aligned> d_;
  std::unique_ptr<float[], free_aligned> s_;
  std::unique_ptr<int32_t[], free_aligned> qsum_;
};

// One product of a batch: y[t * ldy + r] = Σ_c W[r][c] · x[t][c] (or += with accumulate)
// for t < n and every row r of w. Quantized weights read xq (x quantized with q8_buffer);
// float weights read x (row stride ldx).
struct matmul_job {
  const packed_matrix* w = nullptr;
  const float* x = nullptr;
  int64_t ldx = 0;
  const q8_view* xq = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
};

// Runs several products over the same n tokens in one parallel region (as Q, K and V).
void matmul(thread_pool& pool, const isa_kernels& k, std::span<const matmul_job> jobs, int64_t n);

inline void matmul(thread_pool& pool, const isa_kernels& k, const packed_matrix& w, const float* x,
                   int64_t ldx, const q8_view* xq, int64_t n, float* y, int64_t ldy,
                   bool accumulate = false) {
  const matmul_job job{&w, x, ldx, xq, y, ldy, accumulate};
  matmul(pool, k, std::span<const matmul_job>(&job, 1), n);
}

}  // namespace tireless::cpu
