#pragma once
// What every .cu of the backend shares: CUDA error checks that throw, the stream cast, warp
// reductions.
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

// The calling device's opt-in limit of shared memory per block (227 KiB on an H100/H200).
int max_shared_per_block();
// Raises a kernel's dynamic shared-memory limit to `bytes` once per device and kernel; call
// before the kernel's first launch (outside graph capture: launchers do it at their first,
// uncaptured, launch). Throws when the device has less.
void allow_shared(const void* kernel, int bytes, const char* what);

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// 16 bytes global -> shared without passing through registers; valid false zero-fills them and
// reads nothing (global must still be a valid address).
__device__ __forceinline__ void cp_async16(void* smem, const void* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace tireless::cuda::detail
