#pragma once
// Greedy sampling on the device (gpu/cuda/sampling.cu): the argmax of each row of logits, the
// lowest index on ties (the CPU sampler's rule). Other sampling runs on the host, on the
// downloaded logits, with the CPU sampler itself (model/sampler.hpp): the same seeds give the
// same tokens.
#include <cstdint>

namespace tireless::cuda::detail {

// One block of 1024 threads per row.
__global__ void argmax_kernel(const float* logits, int32_t n, int32_t* out);

}  // namespace tireless::cuda::detail
