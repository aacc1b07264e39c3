#pragma once
// The hyperparameters of a Llama-family model (dense, or Mixtral-style mixture of experts),
// read from GGUF metadata and checked for consistency.

#include <cstdint>
#include <string>

namespace tireless {

class gguf_file;

struct model_config {
  std::string architecture;  // general.architecture: "llama"
  std::string name;          // general.name, for display
  int32_t n_vocab = 0;
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int32_t n_ff = 0;          // dense feed-forward width, or each expert's width
  int32_t n_ctx_train = 0;
  int32_t rope_dims = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  int32_t n_expert = 0;       // 0 for a dense model
  int32_t n_expert_used = 0;
  bool tied_embeddings = false;

  bool is_moe() const { return n_expert > 0; }
  int32_t q_dim() const { return n_head * head_dim; }
  int32_t kv_dim() const { return n_head_kv * head_dim; }

  // Throws gguf_error naming the key and the file when a value is missing, zero or
  // inconsistent (heads not dividing the width, KV heads not dividing heads, ...), or when
  // the architecture is not one tireless runs.
  static model_config from_gguf(const gguf_file& file);
};

}  // namespace tireless
