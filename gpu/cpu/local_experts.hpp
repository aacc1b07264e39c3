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

  // One (row, expert) pair per p < n_pairs: out[p * n_embd ...] = expert[p](x[row[p]]). Every
  // expert must be owned. Pairs of one expert are computed together, in their order, so a
  // pair's result does not depend on which other pairs come with it.
  void compute_pairs(int32_t layer, const float* x, int64_t ld, int64_t n_pairs, const int32_t* row,
                     const int32_t* expert, float* out);

  bool owns(int32_t layer, int32_t expert) const;
  // Packs more of the model's experts, each named by its key layer * n_expert + expert (a
  // replica of another shard's, or a fenced shard's); held ones are skipped. Not while a
  // compute runs.
  void hold(const std::vector<int32_t>& keys);
  std::vector<int32_t> held() const;  // keys, ascending

 private:
  struct expert {
    packed_matrix gate, up, down;
  };
  std::shared_ptr<const model> model_;
  thread_pool& pool_;
  const isa_kernels& k_;
  int64_t n_embd_, n_ff_;
  int32_t n_expert_;
  std::vector<char> owned_;                 // [layer * n_expert + expert]
  std::vector<std::vector<expert>> layers_;  // [layer][expert], empty matrices if not owned
  // Scratch, sized once.
  std::vector<float> xe_, g_, u_, ye_, slots_;
  std::vector<int64_t> rows_;
  std::vector<int32_t> pair_row_, pair_expert_;
  q8_buffer q_in_, q_mid_;
};

}  // namespace tireless::cpu
