#pragma once
// The CUDA backend: a Llama-family model (dense or Mixtral-style MoE) on NVIDIA GPUs, with the
// paged fp16 KV cache in device memory laid out as the CPU backend's and read through the same
// block tables. Weights stay in their GGUF types (gpu/cuda/weight_layout.hpp); the products
// quantize activations to 8 bits as the CPU does, so both compute the same sums. Decode steps
// are replayed from CUDA graphs; a MoE model's experts may spread over several GPUs of the
// process (NCCL, gpu/cuda/expert_groups.hpp). No CUDA types here: every program may include it,
// and builds without CUDA get a make_cuda_backend that says so.

#include <memory>
#include <string>
#include <vector>

#include "gpu/backend.hpp"

namespace tireless {
class model;
}

namespace tireless::cuda {

struct cuda_backend_options {
  std::vector<int32_t> devices;    // CUDA device ids, rank order; empty: {0}. Several: MoE only
  int32_t block_size = 16;         // tokens per KV block, a multiple of 8
  int32_t kv_blocks = 0;           // blocks in the pool (refused if they do not fit); 0: as many as
                                   // the device's free memory holds past weights, workspace, reserve
  int32_t max_step_tokens = 512;   // tokens per step
  int32_t max_step_seqs = 256;     // sequences per step
  int32_t max_context = 0;         // 0: the model's training context
  bool graphs = true;              // replay decode steps from CUDA graphs
  int32_t sampling_threads = 0;    // host threads sampling downloaded logits; 0: one per core
};

// Whether this build has the CUDA backend (nvcc was found).
bool cuda_built();
// Whether it can run here: built, a driver, a device. `why` says what is missing.
bool cuda_available(std::string* why = nullptr);

// Throws std::runtime_error saying what is missing (no CUDA in this build, no device, a model
// that does not fit) or std::invalid_argument naming the option that is out of range.
std::unique_ptr<backend> make_cuda_backend(std::shared_ptr<const model> m, const cuda_backend_options& options);

}  // namespace tireless::cuda
