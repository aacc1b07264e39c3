#pragma once
// What every .cu of the backend shares: CUDA error checks that throw, the stream cast.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tireless::cuda::detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
// After a launch: the launch's own error (bad configuration), not the kernel's.
inline void check_launch(const char* what) { check(cudaGetLastError(), what); }
inline cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace tireless::cuda::detail
