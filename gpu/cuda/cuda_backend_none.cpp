// Builds without nvcc: the CUDA backend's factory is here and says it is not.
#include <stdexcept>

#include "gpu/cuda/cuda_backend.hpp"

namespace tireless::cuda {

bool cuda_built() { return false; }

bool cuda_available(std::string* why) {
  if (why) *why = "this build has no CUDA backend (CMake found no nvcc)";
  return false;
}

std::unique_ptr<backend> make_cuda_backend(std::shared_ptr<const model>, const cuda_backend_options&) {
  throw std::runtime_error("backend.kind = \"cuda\": this build has no CUDA backend (CMake found no nvcc); rebuild where "
                           "the CUDA toolkit is installed, or use kind = \"cpu\" or \"auto\"");
}

}  // namespace tireless::cuda
