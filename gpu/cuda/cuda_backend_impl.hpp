#pragma once
// The CUDA backend's class, private to its two sources: cuda_backend.cpp (set-up, the step
// around the model, sampling, block copies) and cuda_forward.cpp (the model's layers on the
// device, and a MoE layer's experts over the GPUs of an expert group).

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gpu/cpu/thread_pool.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/cuda_plan.hpp"
#include "gpu/cuda/cuda_weights.hpp"
#include "gpu/cuda/expert_groups.hpp"
#include "gpu/cuda/ops.hpp"
#include "model/model_config.hpp"

namespace tireless {
class model;
}

namespace tireless::cuda {

class nccl_group;

// 8-bit activations for `rows` rows of up to `widest` values.
struct q8_space {
  int8_t* q = nullptr;
  float *d = nullptr, *s = nullptr;
  q8_rows as(int64_t cols) const { return {q, d, s, cols / 32}; }
};

// Buffers of one rank's share of a MoE layer (rank 0's are the step's own).
struct expert_space {
  float *x = nullptr, *ffn_in = nullptr, *act = nullptr, *y = nullptr;
  int32_t* offsets = nullptr;  // [local experts + 1]
  q8_space q8;
};

// A GPU of an expert group other than the first: its stream, its experts, its buffers.
struct peer_rank {
  int32_t device = 0, first_expert = 0, n_experts = 0;
  std::unique_ptr<stream> s;
  std::vector<expert_layer> experts;
  device_buffer memory;
  expert_space space;
  // Its experts' offsets on their way up, a slot [n_experts + 1] per layer; offsets_sent[layer]
  // is recorded after that slot's copy, and waited for before the host writes the slot again
  // (a step later): no host write can meet a copy still reading it.
  pinned_buffer offsets_host;
  std::vector<event> offsets_sent;
};

class cuda_backend final : public backend {
 public:
  cuda_backend(std::shared_ptr<const model> m, const cuda_backend_options& o);
  ~cuda_backend() override;

  std::string describe() const override;
  kv_geometry kv() const override { return {o_.block_size, kv_.n_blocks, kv_block_bytes_}; }
  backend_limits limits() const override { return {o_.max_step_tokens, o_.max_step_seqs, o_.max_context}; }
  int32_t n_vocab() const override { return c_.n_vocab; }
  step_cost_prior cost_prior() const override;
  void execute(const step_batch& batch, step_result& result) override;
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override;
  std::vector<int64_t> expert_tokens() const override;

 private:
  void check(const step_batch& b) const;
  void allocate_workspace();
  void set_up_expert_group();
  step_view view_of_step(const step_inputs& in) const;
  int32_t checked_splits(int32_t splits, const step_inputs& in) const;
  void forward(const step_view& st, int32_t splits);
  void attention_block(int layer, const step_view& st, int32_t splits);
  void ffn_block(int layer, const step_view& st);
  void moe_block(int layer, const step_view& st);
  void experts_here(const expert_layer& el, const expert_space& sp, const int32_t* offsets, int32_t groups,
                    int32_t pairs, const float* x, void* s, const product_scratch& scratch);
  void experts_across(int layer, const step_view& st);
  void results(const step_batch& b, const step_inputs& in, step_result& result);

  std::shared_ptr<const model> model_;
  const model_config& c_;
  cuda_backend_options o_;
  expert_group_plan group_;
  std::unique_ptr<stream> stream_;
  std::unique_ptr<blas> blas_;
  model_weights w_;
  std::vector<expert_layer> experts_;  // this device's experts (rank 0's range)
  std::vector<peer_rank> peers_;
  std::unique_ptr<nccl_group> nccl_;
  memory_request request_;
  memory_plan plan_;
  workspace_layout layout_;  // of the workspace: the plan's, carved as it says
  device_info device_;

  device_buffer k_pool_, v_pool_;
  kv_cache kv_;
  int64_t kv_block_bytes_ = 0;

  // Workspace (one allocation) and the step's inputs and outputs.
  device_buffer work_;
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *att_ = nullptr, *logits_ = nullptr, *partial_ = nullptr;
  float *router_ = nullptr, *gates_ = nullptr;
  int32_t *chosen_ = nullptr, *pair_row_ = nullptr, *slot_pair_ = nullptr, *offsets_ = nullptr, *argmax_ = nullptr;
  int32_t* words_ = nullptr;
  unsigned long long* counts_ = nullptr;
  expert_space moe_;
  q8_space q8_;
  product_scratch scratch_;
  int64_t qkv_ld_ = 0;
  attention_shape ashape_;
  step_shape sshape_;
  std::vector<int32_t> buckets_;

  pinned_buffer words_host_, argmax_host_, logits_host_, offsets_host_;
  // Recorded after each copy out of words_host_, waited for before the host writes it again
  // (a step that threw may have left its copy pending).
  std::unique_ptr<event> words_sent_;
  std::map<int32_t, std::unique_ptr<graph>> graphs_;
  std::set<int32_t> warmed_, uncapturable_;
  int32_t rows_ = 0;  // of the step being run (padded)
  int32_t outs_ = 0;
  cpu::thread_pool sampling_;
};

}  // namespace tireless::cuda
