#pragma once
// The tensors of a Llama-family model, found by llama.cpp's names and checked against the
// model's configuration (shape and type).

#include <vector>

#include "model/model_config.hpp"

namespace tireless {

class gguf_file;
struct gguf_tensor;

struct layer_tensors {
  const gguf_tensor* attn_norm = nullptr;  // [n_embd] f32
  const gguf_tensor* wq = nullptr;         // [n_embd, q_dim]
  const gguf_tensor* wk = nullptr;         // [n_embd, kv_dim]
  const gguf_tensor* wv = nullptr;         // [n_embd, kv_dim]
  const gguf_tensor* wo = nullptr;         // [q_dim, n_embd]
  const gguf_tensor* ffn_norm = nullptr;   // [n_embd] f32
  // Dense feed-forward.
  const gguf_tensor* ffn_gate = nullptr;   // [n_embd, n_ff]
  const gguf_tensor* ffn_up = nullptr;     // [n_embd, n_ff]
  const gguf_tensor* ffn_down = nullptr;   // [n_ff, n_embd]
  // Mixture of experts.
  const gguf_tensor* ffn_gate_inp = nullptr;   // [n_embd, n_expert] router
  const gguf_tensor* ffn_gate_exps = nullptr;  // [n_embd, n_ff, n_expert]
  const gguf_tensor* ffn_up_exps = nullptr;    // [n_embd, n_ff, n_expert]
  const gguf_tensor* ffn_down_exps = nullptr;  // [n_ff, n_embd, n_expert]
};

struct model_tensors {
  const gguf_tensor* token_embd = nullptr;   // [n_embd, n_vocab]
  const gguf_tensor* output_norm = nullptr;  // [n_embd] f32
  const gguf_tensor* output = nullptr;       // [n_embd, n_vocab]; token_embd when tied
  std::vector<layer_tensors> layers;

  // Throws gguf_error naming the tensor when one is missing or has the wrong shape or type.
  static model_tensors from_gguf(const gguf_file& file, const model_config& config);
};

}  // namespace tireless
