#pragma once
// The CUDA kernels' host entry points (gpu/cuda/*.cu). No CUDA types here, so any C++ file may
// include it: pointers are device pointers, a stream is a cudaStream_t passed as void*
// (nullptr: the default stream). Every launcher throws std::runtime_error with CUDA's message
// when the launch fails; errors inside a kernel surface at synchronize().
//
// Built only where nvcc is found (TIRELESS_HAVE_CUDA); not yet run on a GPU (README.md).

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/tensor_type.hpp"

namespace tireless::cuda {

// Whether a CUDA device can be used here; `why` says why not (no driver, no device, ...).
bool device_available(std::string* why = nullptr);
// Waits for the device; throws with the first error a kernel raised. (A launcher's own check
// reads cudaGetLastError, which may also report an earlier kernel's error.)
void synchronize();

// Device memory, freed when it goes.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);
  ~device_buffer();
  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }
  void upload(const void* src, size_t bytes, size_t offset = 0);  // synchronous
  void download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w, rows of n floats.
void rms_norm(const float* x, const float* w, float* out, int32_t rows, int32_t n, float eps, void* stream = nullptr);
// out = silu(g) * u, n floats (the SwiGLU of the FFN).
void silu_mul(const float* g, const float* u, float* out, int64_t n, void* stream = nullptr);
// RoPE in place on rows of heads x head_dim floats, row r at position pos[r]: adjacent pairs of
// each head's first rope_dims values turned by pos * base^(-2i / rope_dims) (llama.cpp's
// "normal" RoPE, as the CPU backend does).
void rope(float* x, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos, float base,
          void* stream = nullptr);
// out[r] = row ids[r] of a [n_rows][cols] table in its GGUF type, dequantized; an id outside
// the table gives a row of NaN (the caller checks token ids on the host before they go up).
void embed_rows(tensor_type type, const void* table, int64_t n_rows, int64_t cols, const int32_t* ids, int32_t rows,
                float* out, void* stream = nullptr);
// y[r] = row r of w · x, for the rows of a [rows][cols] matrix in its GGUF type (the quantized
// types dequantized inside the kernel): the matrix-vector product of decode.
void matvec(tensor_type type, const void* w, int64_t rows, int64_t cols, const float* x, float* y, void* stream = nullptr);

}  // namespace tireless::cuda
