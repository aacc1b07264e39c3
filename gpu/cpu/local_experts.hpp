#pragma once
// Experts computed on this CPU: all of a model's experts, or a subset (an expert shard).

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/cpu/expert_ffn.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/packed_matrix.hpp"
#include "gpu/cpu/thread_pool.hpp"

namespace tireless {
class model;
}

namespace tireless::cpu {

class local_experts final : public expert_ffn {
 public:
  // Packs the experts in `owned` (all when empty) of every layer. max_tokens bounds
  // routed_tokens::n_tokens per call.
  local_experts(std::shared_ptr<const model> m, thread_pool& pool, const isa_kernels& k,
                int64_t max_tokens, std::vector<int32_t> owned = {});

  void run(const routed_tokens& tokens, float* out, int64_t ld_out) override;

  // The unweighted output of every (token, slot) whose expert this object owns:
  // slots[(t * k + j) * n_embd ...]. Slots of other experts are left untouched.
  void compute_slots(const routed_tokens& tokens, float* slots);

  bool owns(int32_t expert) const;

 private:
  struct expert {
    packed_matrix gate, up, down;
  };
  std::shared_ptr<const model> model_;
  thread_pool& pool_;
  const isa_kernels& k_;
  int64_t n_embd_, n_ff_;
  int32_t n_expert_;
  std::vector<char> owned_;                 // [n_expert]
  std::vector<std::vector<expert>> layers_;  // [layer][expert], empty matrices if not owned
  // Scratch, sized once.
  std::vector<float> xe_, g_, u_, ye_, slots_;
  std::vector<int64_t> rows_;
  q8_buffer q_in_, q_mid_;
};

}  // namespace tireless::cpu
