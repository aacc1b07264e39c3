#include "gpu/cuda/device.cuh"
#include "gpu/cuda/matmul.cuh"
#include "gpu/cuda/matvec.cuh"
#include "gpu/cuda/mmq.cuh"
#include "gpu/cuda/ops.hpp"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tireless::cuda {

namespace detail {

__global__ void to_halves_kernel(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst, int to_bf16) {
  const int64_t total = rows * cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = src[(k / cols) * lds + k % cols];
    dst[k] = to_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}

namespace {

// cuBLAS is opened when the first handle is made, not linked: linked, its libraries' ~110 KB of
// static thread-local storage go into every thread's stack, and a library that starts its
// threads with small stacks (civetweb's 100 KB, under prometheus-cpp's exposer) can no longer
// start any; opened with dlopen, the storage is allocated per thread as it is used.
struct cublas_api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const cublas_api& cublas() {
  static const cublas_api api = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(TIRELESS_CUBLAS_DIR)
    if (!lib) lib = dlopen((std::string(TIRELESS_CUBLAS_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (!lib) {
      throw std::runtime_error("cuBLAS could not be loaded (" + name + ": " + dlerror() +
                               "): install the CUDA toolkit's cuBLAS of this version, or put its folder on LD_LIBRARY_PATH");
    }
    cublas_api a;
    auto find = [&](const char* symbol) {
      void* f = dlsym(lib, symbol);
      if (!f) throw std::runtime_error(std::string("cuBLAS (") + name + ") has no " + symbol);
      return f;
    };
    a.create = reinterpret_cast<decltype(a.create)>(find("cublasCreate_v2"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(find("cublasDestroy_v2"));
    a.set_stream = reinterpret_cast<decltype(a.set_stream)>(find("cublasSetStream_v2"));
    a.set_workspace = reinterpret_cast<decltype(a.set_workspace)>(find("cublasSetWorkspace_v2"));
    a.set_math_mode = reinterpret_cast<decltype(a.set_math_mode)>(find("cublasSetMathMode"));
    a.gemm_ex = reinterpret_cast<decltype(a.gemm_ex)>(find("cublasGemmEx"));
    return a;
  }();
  return api;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

// y[t][r] (+)= W[r] · x[t] through cuBLAS: column-major, y^T (rows x n) = W (rows x cols, the
// row-major matrix read transposed) x x^T (cols x n).
void blas_product(const device_matrix& w, const float* x, int64_t ldx, int32_t n, float* y, int64_t ldy, bool accumulate,
                  const product_scratch& scratch, cudaStream_t s) {
  if (!scratch.cublas) throw std::invalid_argument("matmul: float weights past the matvec need cuBLAS (no handle given)");
  auto* h = static_cast<cublasHandle_t>(scratch.cublas->bound_to(s));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  if (w.type == tensor_type::f32) {
    check_blas(cublas().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.qs, CUDA_R_32F, k, x, CUDA_R_32F,
                            static_cast<int>(ldx), &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (f32)");
    return;
  }
  const size_t need = static_cast<size_t>(n) * static_cast<size_t>(k) * 2;
  if (need > scratch.halves_bytes || !scratch.halves) {
    throw std::invalid_argument("matmul: the fp16 activation scratch is " + std::to_string(scratch.halves_bytes) +
                                " bytes, " + std::to_string(need) + " needed");
  }
  const bool bf16 = w.type == tensor_type::bf16;
  const int64_t total = static_cast<int64_t>(n) * k;
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 65535));
  to_halves_kernel<<<blocks, 256, 0, s>>>(x, ldx, n, k, static_cast<uint16_t*>(scratch.halves), bf16 ? 1 : 0);
  check_launch("matmul: activations to fp16");
  const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  check_blas(cublas().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.qs, t, k, scratch.halves, t, k, &beta, y,
                          CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             bf16 ? "cublasGemmEx (bf16)" : "cublasGemmEx (f16)");
}

void check_product(const device_matrix& w, const q8_rows* xq, const char* what) {
  if (is_quantized(w.type)) {
    if (!xq || !xq->q) throw std::invalid_argument(std::string(what) + ": quantized weights need quantized activations");
    if (xq->blocks != w.cols / 32) {
      throw std::invalid_argument(std::string(what) + ": activations of " + std::to_string(xq->blocks * 32) +
                                  " values for a matrix of " + std::to_string(w.cols) + " columns");
    }
  } else if (w.cols % 8 != 0) {
    throw std::invalid_argument(std::string(what) + ": float weights need a multiple of 8 columns");
  }
}

}  // namespace
}  // namespace detail

// 32 MiB: what cuBLAS asks for on Hopper.
blas::blas(void* stream) : workspace_(32u << 20) {
  cublasHandle_t h = nullptr;
  detail::check_blas(detail::cublas().create(&h), "cublasCreate");
  h_ = h;
  detail::check_blas(detail::cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  bind(stream);
}

void blas::bind(void* stream) {
  auto* h = static_cast<cublasHandle_t>(h_);
  // In this order: cublasSetStream resets the workspace to cuBLAS's default pool.
  detail::check_blas(detail::cublas().set_stream(h, detail::stream_of(stream)), "cublasSetStream");
  detail::check_blas(detail::cublas().set_workspace(h, workspace_.data(), workspace_.size()), "cublasSetWorkspace");
  stream_ = stream;
}

void* blas::bound_to(void* stream) {
  if (stream != stream_) bind(stream);
  return h_;
}

blas::~blas() {
  if (h_) detail::cublas().destroy(static_cast<cublasHandle_t>(h_));
}

void matmul(const device_matrix& w, const float* x, int64_t ldx, const q8_rows* xq, int32_t n, float* y, int64_t ldy,
            bool accumulate, const product_scratch& scratch, void* stream) {
  if (n <= 0 || w.rows == 0) return;
  detail::check_product(w, xq, "matmul");
  const cudaStream_t s = detail::stream_of(stream);
  if (detail::launch_matvec(w, x, ldx, xq, n, y, ldy, accumulate, nullptr, 0, 0, s)) return;
  if (is_quantized(w.type)) {
    detail::launch_mmq(w, *xq, n, y, ldy, accumulate, nullptr, 0, 0, s);
  } else {
    detail::blas_product(w, x, ldx, n, y, ldy, accumulate, scratch, s);
  }
}

void grouped_matmul(const device_matrix& w, int64_t rows_per_group, int32_t groups, const int32_t* offsets,
                    const float* x, int64_t ldx, const q8_rows* xq, int32_t pairs, float* y, int64_t ldy,
                    const product_scratch& /*scratch*/, void* stream) {
  if (pairs <= 0) return;
  detail::check_product(w, xq, "grouped_matmul");
  if (groups < 1 || rows_per_group < 1 || rows_per_group * groups > w.rows) {
    throw std::invalid_argument("grouped_matmul: " + std::to_string(groups) + " groups of " + std::to_string(rows_per_group) +
                                " rows do not fit a matrix of " + std::to_string(w.rows));
  }
  const cudaStream_t s = detail::stream_of(stream);
  // Few pairs (decode), or float weights: the matvec over tiles of an expert's pairs (its rows
  // read once a tile); many pairs of quantized weights: the tensor-core product over each
  // expert's pairs.
  if (is_quantized(w.type) && pairs > 2 * groups + matvec_max_tokens) {
    detail::launch_mmq(w, *xq, pairs, y, ldy, false, offsets, groups, rows_per_group, s);
    return;
  }
  if (!detail::launch_matvec(w, x, ldx, xq, pairs, y, ldy, false, offsets, groups, rows_per_group, s)) {
    if (!is_quantized(w.type)) {
      throw std::invalid_argument("grouped_matmul: " + std::to_string(pairs) + " pairs of float experts: more tiles than one launch has");
    }
    detail::launch_mmq(w, *xq, pairs, y, ldy, false, offsets, groups, rows_per_group, s);
  }
}

}  // namespace tireless::cuda
