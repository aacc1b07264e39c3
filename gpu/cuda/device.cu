#include "gpu/cuda/device.cuh"
#include "gpu/cuda/ops.hpp"

#include <utility>

namespace tireless::cuda {

using detail::check;

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("CUDA: ") + cudaGetErrorString(e) : std::string("no CUDA device");
    cudaGetLastError();  // clear it
    return false;
  }
  return true;
}

void synchronize() { check(cudaDeviceSynchronize(), "a CUDA kernel failed"); }

device_buffer::device_buffer(size_t bytes) : n_(bytes) {
  if (bytes > 0) check(cudaMalloc(&p_, bytes), "cudaMalloc");
}
device_buffer::~device_buffer() {
  if (p_) cudaFree(p_);
}
device_buffer::device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}
void device_buffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > n_) throw std::out_of_range("device_buffer::upload past its end");
  check(cudaMemcpy(static_cast<char*>(p_) + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void device_buffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > n_) throw std::out_of_range("device_buffer::download past its end");
  check(cudaMemcpy(dst, static_cast<const char*>(p_) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

}  // namespace tireless::cuda
