#include "gpu/cpu/local_experts.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <stdexcept>
#include <string>

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
  const auto n_layer = static_cast<int32_t>(model_->tensors().layers.size());
  owned_.assign(static_cast<size_t>(n_layer) * n_expert_, 0);
  layers_.resize(static_cast<size_t>(n_layer));
  for (auto& l : layers_) l.resize(static_cast<size_t>(n_expert_));
  if (owned.empty()) {
    owned.resize(static_cast<size_t>(n_expert_));
    for (int32_t e = 0; e < n_expert_; ++e) owned[e] = e;
  }
  std::vector<int32_t> keys;
  for (int32_t l = 0; l < n_layer; ++l) {
    for (int32_t e : owned) {
      if (e < 0 || e >= n_expert_) throw std::out_of_range("expert " + std::to_string(e) + " is not in the model");
      keys.push_back(l * n_expert_ + e);
    }
  }
  hold(keys);
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

void local_experts::hold(const std::vector<int32_t>& keys) {
  const auto& layers = model_->tensors().layers;
  for (int32_t key : keys) {
    if (key < 0 || static_cast<size_t>(key) >= owned_.size()) {
      throw std::out_of_range("expert key " + std::to_string(key) + " is not in the model (layer * " +
                              std::to_string(n_expert_) + " + expert)");
    }
    if (owned_[static_cast<size_t>(key)]) continue;
    const int32_t l = key / n_expert_, e = key % n_expert_;
    layers_[l][e] = {expert_rows(*layers[l].ffn_gate_exps, e), expert_rows(*layers[l].ffn_up_exps, e),
                     expert_rows(*layers[l].ffn_down_exps, e)};
    owned_[static_cast<size_t>(key)] = 1;
  }
}

std::vector<int32_t> local_experts::held() const {
  std::vector<int32_t> r;
  for (size_t key = 0; key < owned_.size(); ++key) {
    if (owned_[key]) r.push_back(static_cast<int32_t>(key));
  }
  return r;
}

bool local_experts::owns(int32_t layer, int32_t e) const {
  return layer >= 0 && e >= 0 && e < n_expert_ && static_cast<size_t>(layer) < layers_.size() &&
         owned_[static_cast<size_t>(layer) * n_expert_ + e] != 0;
}

void local_experts::compute_slots(const routed_tokens& rt, float* slots) {
  const int64_t n_slots = rt.n_tokens * rt.k;
  pair_row_.clear();
  pair_expert_.clear();
  rows_.clear();
  for (int64_t s = 0; s < n_slots; ++s) {
    if (!owns(rt.layer, rt.experts[s])) continue;
    pair_row_.push_back(static_cast<int32_t>(s / rt.k));
    pair_expert_.push_back(rt.experts[s]);
    rows_.push_back(s);
  }
  const int64_t n = static_cast<int64_t>(pair_row_.size());
  compute_pairs(rt.layer, rt.x, rt.ld, n, pair_row_.data(), pair_expert_.data(), slots_.data());
  for (int64_t p = n - 1; p >= 0; --p) {  // slots_ and slots may be the same buffer (run)
    std::memmove(slots + rows_[p] * n_embd_, &slots_[p * n_embd_], n_embd_ * sizeof(float));
  }
}

void local_experts::compute_pairs(int32_t layer, const float* x, int64_t ld, int64_t n_pairs, const int32_t* row,
                                  const int32_t* experts, float* out) {
  if (n_pairs > static_cast<int64_t>(xe_.size() / n_embd_)) {
    throw std::length_error("expert call of " + std::to_string(n_pairs) + " pairs exceeds the shard's max tokens");
  }
  if (layer < 0 || layer >= static_cast<int32_t>(layers_.size())) throw std::out_of_range("no such layer");
  std::vector<int64_t> pairs;
  pairs.reserve(static_cast<size_t>(n_pairs));
  for (int32_t e = 0; e < n_expert_; ++e) {
    pairs.clear();
    for (int64_t p = 0; p < n_pairs; ++p) {
      if (experts[p] == e) pairs.push_back(p);
    }
    if (pairs.empty()) continue;
    if (!owns(layer, e)) {
      throw std::invalid_argument("expert " + std::to_string(e) + " of layer " + std::to_string(layer) + " is not held here");
    }
    const int64_t m = static_cast<int64_t>(pairs.size());
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(&xe_[i * n_embd_], x + row[pairs[i]] * ld, n_embd_ * sizeof(float));
    }
    const expert& ex = layers_[layer][e];
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
      std::memcpy(out + pairs[i] * n_embd_, &ye_[i * n_embd_], n_embd_ * sizeof(float));
    }
  }
}

void local_experts::run(const routed_tokens& rt, float* out, int64_t ld_out) {
  compute_slots(rt, slots_.data());
  combine_slots(rt, slots_.data(), n_embd_, out, ld_out);
}

}  // namespace tireless::cpu
