#include "gpu/cpu/local_experts.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "model/model.hpp"

namespace tireless::cpu {

namespace {

// Expert e's rows of a [cols, rows_per_expert, n_expert] tensor.
packed_matrix expert_rows(const gguf_tensor& t, int32_t e) {
  const int64_t cols = t.shape[0], rows = t.shape[1];
  const std::byte* base = t.data + static_cast<size_t>(e) * rows * row_bytes(t.type, cols);
  return packed_matrix::pack(t.type, base, rows, cols);
}

}  // namespace

local_experts::local_experts(std::shared_ptr<const model> m, thread_pool& pool,
                             const isa_kernels& k, int64_t max_tokens, std::vector<int32_t> owned)
    : model_(std::move(m)), pool_(pool), k_(k) {
  const model_config& c = model_->config();
  n_embd_ = c.n_embd;
  n_ff_ = c.n_ff;
  n_expert_ = c.n_expert;
  owned_.assign(static_cast<size_t>(n_expert_), owned.empty() ? 1 : 0);
  for (int32_t e : owned) {
    assert(e >= 0 && e < n_expert_);
    owned_[static_cast<size_t>(e)] = 1;
  }
  for (const layer_tensors& l : model_->tensors().layers) {
    std::vector<expert> experts(static_cast<size_t>(n_expert_));
    for (int32_t e = 0; e < n_expert_; ++e) {
      if (!owns(e)) continue;
      experts[e] = {expert_rows(*l.ffn_gate_exps, e), expert_rows(*l.ffn_up_exps, e),
                    expert_rows(*l.ffn_down_exps, e)};
    }
    layers_.push_back(std::move(experts));
  }
  const int64_t slots = max_tokens * std::max(c.n_expert_used, 1);
  xe_.resize(static_cast<size_t>(slots * n_embd_));
  ye_.resize(static_cast<size_t>(slots * n_embd_));
  g_.resize(static_cast<size_t>(slots * n_ff_));
  u_.resize(static_cast<size_t>(slots * n_ff_));
  slots_.resize(static_cast<size_t>(slots * n_embd_));
  rows_.reserve(static_cast<size_t>(slots));
  q_in_ = q8_buffer(slots, n_embd_);
  q_mid_ = q8_buffer(slots, n_ff_);
}

bool local_experts::owns(int32_t e) const { return owned_[static_cast<size_t>(e)] != 0; }

void local_experts::compute_slots(const routed_tokens& rt, float* slots) {
  const int64_t n_slots = rt.n_tokens * rt.k;
  for (int32_t e = 0; e < n_expert_; ++e) {
    if (!owns(e)) continue;
    rows_.clear();
    for (int64_t s = 0; s < n_slots; ++s) {
      if (rt.experts[s] == e) rows_.push_back(s);
    }
    if (rows_.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows_.size());
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(&xe_[i * n_embd_], rt.x + (rows_[i] / rt.k) * rt.ld, n_embd_ * sizeof(float));
    }
    const expert& ex = layers_[rt.layer][e];
    const q8_view* xq = nullptr;
    q8_view xq_storage;
    if (ex.gate.quantized() || ex.up.quantized()) {
      xq_storage = q_in_.quantize(pool_, k_, xe_.data(), m, n_embd_, n_embd_);
      xq = &xq_storage;
    }
    matmul(pool_, k_, ex.gate, xe_.data(), n_embd_, xq, m, g_.data(), n_ff_);
    matmul(pool_, k_, ex.up, xe_.data(), n_embd_, xq, m, u_.data(), n_ff_);
    k_.silu_mul(g_.data(), u_.data(), g_.data(), m * n_ff_);
    const q8_view* gq = nullptr;
    if (ex.down.quantized()) {
      xq_storage = q_mid_.quantize(pool_, k_, g_.data(), m, n_ff_, n_ff_);
      gq = &xq_storage;
    }
    matmul(pool_, k_, ex.down, g_.data(), n_ff_, gq, m, ye_.data(), n_embd_);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(slots + rows_[i] * n_embd_, &ye_[i * n_embd_], n_embd_ * sizeof(float));
    }
  }
}

void local_experts::run(const routed_tokens& rt, float* out, int64_t ld_out) {
  compute_slots(rt, slots_.data());
  for (int64_t t = 0; t < rt.n_tokens; ++t) {
    float* o = out + t * ld_out;
    std::fill(o, o + n_embd_, 0.0f);
    for (int32_t j = 0; j < rt.k; ++j) {
      const float gate = rt.gates[t * rt.k + j];
      const float* y = &slots_[(t * rt.k + j) * n_embd_];
      for (int64_t c = 0; c < n_embd_; ++c) o[c] += gate * y[c];
    }
  }
}

}  // namespace tireless::cpu
