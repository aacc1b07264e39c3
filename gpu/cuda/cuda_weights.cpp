#include "gpu/cuda/cuda_weights.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "model/model.hpp"

namespace tireless::cuda {

namespace {

// Rows of a tensor to write into a matrix: `rows` rows starting at `data`.
struct rows_of {
  const std::byte* data;
  int64_t rows;
};

void check_width(const gguf_tensor& t) {
  const int64_t cols = t.shape[0];
  if (is_quantized(t.type) ? cols % 32 != 0 : cols % 8 != 0) {
    throw std::runtime_error(fmt::format("tensor {} ({}, {} columns): the CUDA backend needs rows of a multiple of {} values",
                                         t.name, name(t.type), cols, is_quantized(t.type) ? 32 : 8));
  }
}

// Expert e's rows of a [cols, rows_per_expert, n_expert] tensor.
rows_of expert_rows(const gguf_tensor& t, int32_t e) {
  const int64_t rows = t.shape[1];
  return {t.data + static_cast<size_t>(e) * static_cast<size_t>(rows) * row_bytes(t.type, t.shape[0]), rows};
}

rows_of all_rows(const gguf_tensor& t) { return {t.data, t.n_rows()}; }

device_weight upload(tensor_type type, int64_t cols, const std::vector<rows_of>& parts) {
  int64_t rows = 0;
  for (const rows_of& p : parts) rows += p.rows;
  const matrix_layout l = layout_of(type, rows, cols);
  std::vector<std::byte> host(l.bytes);
  int64_t at = 0;
  for (const rows_of& p : parts) {
    repack_rows(l, p.data, p.rows, at, host.data());
    at += p.rows;
  }
  device_weight w;
  w.memory = device_buffer(l.bytes);
  w.memory.upload(host.data(), host.size());
  w.m = view_of(l, w.memory.data());
  return w;
}

product_part part_of(const gguf_tensor& t, int64_t column = 0) {
  check_width(t);
  return {upload(t.type, t.shape[0], {all_rows(t)}), column, 0};
}

device_buffer floats_of(const gguf_tensor& t) {
  if (t.type != tensor_type::f32) throw std::runtime_error(fmt::format("tensor {}: a norm must be f32", t.name));
  device_buffer b(t.n_bytes);
  b.upload(t.data, t.n_bytes);
  return b;
}

// Tensors of one output, fused into one matrix when they share a type, else one part each.
std::vector<product_part> fused(const std::vector<const gguf_tensor*>& ts) {
  bool same = true;
  for (const gguf_tensor* t : ts) same = same && t->type == ts[0]->type && t->shape[0] == ts[0]->shape[0];
  std::vector<product_part> parts;
  int64_t column = 0;
  if (same) {
    std::vector<rows_of> rows;
    for (const gguf_tensor* t : ts) {
      check_width(*t);
      rows.push_back(all_rows(*t));
    }
    parts.push_back({upload(ts[0]->type, ts[0]->shape[0], rows), 0, 0});
    return parts;
  }
  for (const gguf_tensor* t : ts) {
    parts.push_back(part_of(*t, column));
    column += t->n_rows();
  }
  return parts;
}

}  // namespace

int64_t weight_bytes(const model& m, bool with_dense, int32_t first_expert, int32_t n_experts) {
  const model_tensors& t = m.tensors();
  int64_t bytes = 0;
  const auto add = [&](const gguf_tensor* x, int64_t rows) {
    if (x) bytes += static_cast<int64_t>(layout_of(x->type, rows, x->shape[0]).bytes);
  };
  if (with_dense) {
    add(t.token_embd, t.token_embd->n_rows());
    if (!m.config().tied_embeddings) add(t.output, t.output->n_rows());
    bytes += static_cast<int64_t>(t.output_norm->n_bytes);
  }
  for (const layer_tensors& l : t.layers) {
    if (with_dense) {
      for (const gguf_tensor* x : {l.wq, l.wk, l.wv, l.wo, l.ffn_gate, l.ffn_up, l.ffn_down, l.ffn_gate_inp}) {
        if (x) add(x, x->n_rows());
      }
      bytes += static_cast<int64_t>(l.attn_norm->n_bytes + l.ffn_norm->n_bytes);
    }
    for (const gguf_tensor* x : {l.ffn_gate_exps, l.ffn_up_exps, l.ffn_down_exps}) {
      if (x) add(x, x->shape[1] * n_experts);
    }
  }
  (void)first_expert;  // every expert of a layer has the same size
  return bytes;
}

model_weights upload_dense_weights(const model& m) {
  const model_tensors& t = m.tensors();
  model_weights w;
  w.tied = m.config().tied_embeddings;
  w.token_embd = part_of(*t.token_embd);
  if (!w.tied) w.output = part_of(*t.output);
  w.output_norm = floats_of(*t.output_norm);
  for (const layer_tensors& l : t.layers) {
    layer_weights lw;
    lw.attn_norm = floats_of(*l.attn_norm);
    lw.ffn_norm = floats_of(*l.ffn_norm);
    lw.qkv = fused({l.wq, l.wk, l.wv});
    lw.wo = part_of(*l.wo);
    if (l.ffn_gate_inp) {
      lw.router = part_of(*l.ffn_gate_inp);
    } else {
      lw.gate_up = fused({l.ffn_gate, l.ffn_up});
      lw.down = part_of(*l.ffn_down);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

std::vector<expert_layer> upload_experts(const model& m, int32_t first, int32_t count) {
  std::vector<expert_layer> layers;
  const int64_t n_ff = m.config().n_ff;
  for (const layer_tensors& l : m.tensors().layers) {
    expert_layer el;
    const gguf_tensor &gate = *l.ffn_gate_exps, &up = *l.ffn_up_exps, &down = *l.ffn_down_exps;
    for (const gguf_tensor* x : {&gate, &up, &down}) check_width(*x);
    if (gate.type == up.type) {
      std::vector<rows_of> rows;  // expert after expert: its gate rows, then its up rows
      for (int32_t e = first; e < first + count; ++e) {
        rows.push_back(expert_rows(gate, e));
        rows.push_back(expert_rows(up, e));
      }
      el.gate_up.push_back({upload(gate.type, gate.shape[0], rows), 0, 2 * n_ff});
    } else {
      for (const gguf_tensor* x : {&gate, &up}) {
        std::vector<rows_of> rows;
        for (int32_t e = first; e < first + count; ++e) rows.push_back(expert_rows(*x, e));
        el.gate_up.push_back({upload(x->type, x->shape[0], rows), x == &gate ? 0 : n_ff, n_ff});
      }
    }
    std::vector<rows_of> rows;
    for (int32_t e = first; e < first + count; ++e) rows.push_back(expert_rows(down, e));
    el.down = {upload(down.type, down.shape[0], rows), 0, down.shape[1]};
    layers.push_back(std::move(el));
  }
  return layers;
}

}  // namespace tireless::cuda
