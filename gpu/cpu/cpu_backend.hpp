#pragma once
// The CPU backend: a Llama-family model (dense or MoE) on this machine's cores, with a paged
// KV cache in fp16. One step runs prefill chunks and decode tokens of many sequences at once.

#include <memory>
#include <optional>

#include "gpu/backend.hpp"
#include "gpu/cpu/expert_ffn.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless {
class model;
}

namespace tireless::cpu {

struct cpu_backend_options {
  int threads = 0;                 // 0: one per core
  int32_t block_size = 16;         // tokens per KV block
  int32_t kv_blocks = 0;           // blocks in the pool; 0: enough for max_context tokens
  int32_t max_step_tokens = 512;   // tokens per step
  int32_t max_step_seqs = 256;     // sequences per step
  int32_t max_context = 0;         // 0: the model's training context
  std::optional<isa> kernels;      // default: the best the CPU runs
  // Where MoE experts run; null: in this backend. Not owned; must outlive the backend.
  expert_ffn* experts = nullptr;
  // Split a step of several sequences into two micro-batches, one's attention here while the
  // other's experts run (where `experts` can: shards in other processes).
  bool overlap = false;
};

// Throws std::invalid_argument naming the option when an option is out of range.
std::unique_ptr<backend> make_cpu_backend(std::shared_ptr<const model> m,
                                          const cpu_backend_options& options);

}  // namespace tireless::cpu
