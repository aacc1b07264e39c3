// Builds with CUDA but without NCCL: several GPUs fall back to one (expert_groups.cpp), and a
// group is never made; if it is, it says why it cannot be.
#include <stdexcept>

#include "gpu/cuda/nccl_exchange.hpp"

namespace tireless::cuda {

bool nccl_built() { return false; }

nccl_group::nccl_group(const std::vector<int32_t>&) {
  throw std::runtime_error("this build has no NCCL (CMake did not find nccl.h and libnccl): the experts cannot spread "
                           "over several GPUs; list one device in backend.cuda_devices");
}

nccl_group::~nccl_group() = default;

void nccl_group::all_to_all(const exchange_counts&, int64_t, const std::vector<const void*>&, const std::vector<void*>&,
                            const std::vector<void*>&) {
  throw std::runtime_error("this build has no NCCL");
}

}  // namespace tireless::cuda
