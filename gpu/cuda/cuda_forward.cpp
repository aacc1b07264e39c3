// The model's layers on the device, one step: attention, the dense FFN or the MoE layer, the
// LM head; a MoE layer's experts run here or over the GPUs of the expert group (NCCL).

#include <algorithm>
#include <span>
#include <vector>

#include "gpu/cuda/cuda_backend_impl.hpp"
#include "gpu/cuda/nccl_exchange.hpp"

namespace tireless::cuda {

void cuda_backend::forward(const step_view& st, int32_t splits) {
  void* s = stream_->handle();
  const int64_t e = c_.n_embd;
  embed_rows(w_.token_embd.w.m, st.tokens, rows_, x_, s);
  for (int layer = 0; layer < c_.n_layer; ++layer) {
    attention_block(layer, st, splits);
    if (c_.is_moe()) {
      moe_block(layer, st);
    } else {
      ffn_block(layer, st);
    }
  }
  // The sampled rows' logits: their final norm (gathered), the LM head, the greedy choice.
  const device_matrix& out = w_.output_matrix();
  const q8_rows hq = q8_.as(e);
  rms_norm(x_, w_.output_norm.as<float>(), h_, outs_, static_cast<int32_t>(e), c_.rms_eps, s,
           is_quantized(out.type) ? &hq : nullptr, st.outs);
  matmul(out, h_, e, &hq, outs_, logits_, c_.n_vocab, false, scratch_, s);
  argmax_rows(logits_, outs_, c_.n_vocab, argmax_, s);
}

namespace {

bool any_quantized(const std::vector<product_part>& parts) {
  return std::any_of(parts.begin(), parts.end(), [](const product_part& p) { return p.w.quantized(); });
}

}  // namespace

void cuda_backend::attention_block(int layer, const step_view& st, int32_t splits) {
  const layer_weights& w = w_.layers[layer];
  void* s = stream_->handle();
  const int64_t e = c_.n_embd, qd = c_.q_dim();
  const q8_rows hq = q8_.as(e);
  rms_norm(x_, w.attn_norm.as<float>(), h_, rows_, static_cast<int32_t>(e), c_.rms_eps, s,
           any_quantized(w.qkv) ? &hq : nullptr);
  for (const product_part& p : w.qkv) matmul(p.w.m, h_, e, &hq, rows_, qkv_ + p.column, qkv_ld_, false, scratch_, s);
  rope_store_kv(qkv_, qkv_ld_, st, ashape_, kv_, layer, s);
  paged_attention(qkv_, qkv_ld_, att_, qd, st, ashape_, kv_, layer, splits, partial_, s);
  const q8_rows aq = q8_.as(qd);
  if (w.wo.w.quantized()) quantize_q8(att_, qd, rows_, qd, nullptr, aq, s);
  matmul(w.wo.w.m, att_, qd, &aq, rows_, x_, e, true, scratch_, s);
}

void cuda_backend::ffn_block(int layer, const step_view&) {
  const layer_weights& w = w_.layers[layer];
  void* s = stream_->handle();
  const int64_t e = c_.n_embd, ff = c_.n_ff;
  const q8_rows hq = q8_.as(e), gq = q8_.as(ff);
  rms_norm(x_, w.ffn_norm.as<float>(), h_, rows_, static_cast<int32_t>(e), c_.rms_eps, s,
           any_quantized(w.gate_up) ? &hq : nullptr);
  for (const product_part& p : w.gate_up) {
    matmul(p.w.m, h_, e, &hq, rows_, moe_.ffn_in + p.column, 2 * ff, false, scratch_, s);
  }
  silu_mul(moe_.ffn_in, moe_.ffn_in + ff, 2 * ff, rows_, ff, moe_.act, w.down.w.quantized() ? &gq : nullptr, s);
  matmul(w.down.w.m, moe_.act, ff, &gq, rows_, x_, e, true, scratch_, s);
}

// Pairs [0, pairs) of one expert group's share, grouped by its experts (offsets, `groups`
// local experts), their inputs x [pairs][n_embd] f32 (quantized here where the weights are):
// outputs into sp.y [pairs][n_embd].
void cuda_backend::experts_here(const expert_layer& el, const expert_space& sp, const int32_t* offsets, int32_t groups,
                                int32_t pairs, const float* x, void* s, const product_scratch& scratch) {
  if (pairs <= 0) return;
  const int64_t e = c_.n_embd, ff = c_.n_ff;
  const q8_rows xq = sp.q8.as(e), gq = sp.q8.as(ff);
  if (any_quantized(el.gate_up)) quantize_q8(x, e, pairs, e, nullptr, xq, s);
  for (const product_part& p : el.gate_up) {
    grouped_matmul(p.w.m, p.rows_per_expert, groups, offsets, x, e, &xq, pairs, sp.ffn_in + p.column, 2 * ff, scratch, s);
  }
  silu_mul(sp.ffn_in, sp.ffn_in + ff, 2 * ff, pairs, ff, sp.act, el.down.w.quantized() ? &gq : nullptr, s);
  grouped_matmul(el.down.w.m, el.down.rows_per_expert, groups, offsets, sp.act, ff, &gq, pairs, sp.y, e, scratch, s);
}

void cuda_backend::moe_block(int layer, const step_view& st) {
  const layer_weights& w = w_.layers[layer];
  void* s = stream_->handle();
  const int64_t e = c_.n_embd;
  const int32_t k = c_.n_expert_used;
  const q8_rows hq = q8_.as(e);
  rms_norm(x_, w.ffn_norm.as<float>(), h_, rows_, static_cast<int32_t>(e), c_.rms_eps, s,
           w.router.w.quantized() ? &hq : nullptr);
  matmul(w.router.w.m, h_, e, &hq, rows_, router_, c_.n_expert, false, scratch_, s);
  moe_route(router_, rows_, c_.n_expert, k, st.row_seq, chosen_, gates_, counts_ + int64_t{layer} * c_.n_expert, s);
  moe_group(chosen_, rows_, k, c_.n_expert, offsets_, pair_row_, slot_pair_, s);
  // The pairs' inputs in pair order (their quantization then happens in pair order too: a
  // row's 8-bit form does not depend on its neighbours).
  gather_rows(h_, e, pair_row_, rows_ * k, e, moe_.x, e, s);
  if (group_.exchanges()) {
    experts_across(layer, st);
  } else {
    experts_here(experts_[layer], moe_, offsets_, c_.n_expert, rows_ * k, moe_.x, s, scratch_);
  }
  moe_combine(moe_.y, e, slot_pair_, gates_, rows_, k, e, x_, e, s);
}

// The experts of one layer over the group: rank 0 learns how many pairs each rank gets (one
// download), sends each its pairs' inputs (NCCL), every rank runs its experts on its own stream,
// and the outputs come back into rank 0's pair order.
void cuda_backend::experts_across(int layer, const step_view&) {
  void* s = stream_->handle();
  const int32_t n_exp = c_.n_expert;
  copy_to_host_async(offsets_host_.data(), offsets_, static_cast<size_t>(n_exp + 1) * 4, s);
  stream_->synchronize();
  const std::span<const int32_t> offsets(offsets_host_.as<int32_t>(), static_cast<size_t>(n_exp + 1));
  const exchange_counts dispatch = dispatch_counts(group_, offsets);
  const int64_t row_bytes = c_.n_embd * 4;
  std::vector<const void*> send{moe_.x};
  std::vector<void*> recv{moe_.x}, streams{s};
  for (peer_rank& p : peers_) {
    send.push_back(p.space.x);
    recv.push_back(p.space.x);
    streams.push_back(p.s->handle());
  }
  nccl_->all_to_all(dispatch, row_bytes, send, recv, streams);
  // Each rank's experts, offsets relative to its first pair.
  const auto local = [&](int32_t first, int32_t count, int32_t* dst) {
    for (int32_t i = 0; i <= count; ++i) dst[i] = offsets[first + i] - offsets[first];
  };
  for (peer_rank& p : peers_) {
    set_device(p.device);
    // This layer's slot was last read by the copy of a step ago (long done, as a rule).
    int32_t* slot = p.offsets_host.as<int32_t>() + static_cast<int64_t>(layer) * (p.n_experts + 1);
    p.offsets_sent[layer].synchronize();
    local(p.first_expert, p.n_experts, slot);
    copy_to_device_async(p.space.offsets, slot, static_cast<size_t>(p.n_experts + 1) * 4, p.s->handle());
    p.offsets_sent[layer].record(p.s->handle());
    const int32_t pairs = offsets[p.first_expert + p.n_experts] - offsets[p.first_expert];
    const product_scratch none{};
    experts_here(p.experts[layer], p.space, p.space.offsets, p.n_experts, pairs, p.space.x, p.s->handle(), none);
  }
  set_device(group_.devices[0]);
  // Rank 0's experts come first: its pairs start at 0 and its offsets are the step's own.
  const int32_t mine = group_.first_expert[1];
  experts_here(experts_[layer], moe_, offsets_, mine, offsets[mine], moe_.x, s, scratch_);
  std::vector<const void*> back{moe_.y};
  std::vector<void*> into{moe_.y};
  for (peer_rank& p : peers_) {
    back.push_back(p.space.y);
    into.push_back(p.space.y);
  }
  nccl_->all_to_all(transpose(dispatch), row_bytes, back, into, streams);
}

}  // namespace tireless::cuda
