#include "model/model_config.hpp"

#include <fmt/format.h>

#include "model/gguf_file.hpp"

namespace tireless {

namespace {

[[noreturn]] void bad(const gguf_file& f, const std::string& what) {
  throw gguf_error(fmt::format("{}: {}", f.path().string(), what));
}

int32_t positive(const gguf_file& f, const std::string& key) {
  const uint32_t v = f.get_u32(key);
  if (v == 0 || v > (1u << 30)) bad(f, fmt::format("key '{}' is {}, expected a positive count", key, v));
  return static_cast<int32_t>(v);
}

}  // namespace

model_config model_config::from_gguf(const gguf_file& f) {
  model_config c;
  c.architecture = f.get_string("general.architecture");
  if (c.architecture != "llama") {
    bad(f, fmt::format("general.architecture is '{}'; tireless runs 'llama' (Llama-family dense "
                       "and Mixtral-style MoE models)",
                       c.architecture));
  }
  c.name = f.find_string("general.name").value_or("");
  const std::string a = c.architecture + ".";
  c.n_embd = positive(f, a + "embedding_length");
  c.n_layer = positive(f, a + "block_count");
  c.n_head = positive(f, a + "attention.head_count");
  c.n_head_kv = f.has(a + "attention.head_count_kv") ? positive(f, a + "attention.head_count_kv")
                                                      : c.n_head;
  c.n_ff = positive(f, a + "feed_forward_length");
  c.n_ctx_train = positive(f, a + "context_length");
  c.rope_base = f.find_f32(a + "rope.freq_base").value_or(10000.0f);
  c.rms_eps = f.get_f32(a + "attention.layer_norm_rms_epsilon");
  if (c.n_embd % c.n_head != 0) {
    bad(f, fmt::format("{}embedding_length {} is not a multiple of {}attention.head_count {}", a,
                       c.n_embd, a, c.n_head));
  }
  c.head_dim = c.n_embd / c.n_head;
  if (c.n_head % c.n_head_kv != 0) {
    bad(f, fmt::format("{}attention.head_count {} is not a multiple of {}attention.head_count_kv {}",
                       a, c.n_head, a, c.n_head_kv));
  }
  c.rope_dims = f.has(a + "rope.dimension_count") ? positive(f, a + "rope.dimension_count") : c.head_dim;
  if (c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    bad(f, fmt::format("{}rope.dimension_count {} must be even and at most the head size {}", a,
                       c.rope_dims, c.head_dim));
  }
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) {
    bad(f, fmt::format("{}attention.layer_norm_rms_epsilon {} is outside (0, 1)", a, c.rms_eps));
  }
  if (!(c.rope_base > 1.0f)) bad(f, fmt::format("{}rope.freq_base {} must exceed 1", a, c.rope_base));
  if (f.has(a + "expert_count")) {
    c.n_expert = static_cast<int32_t>(f.get_u32(a + "expert_count"));
    c.n_expert_used = c.n_expert > 0 ? positive(f, a + "expert_used_count") : 0;
    if (c.n_expert_used > c.n_expert) {
      bad(f, fmt::format("{}expert_used_count {} exceeds {}expert_count {}", a, c.n_expert_used, a,
                         c.n_expert));
    }
  }
  const gguf_tensor& embd = f.tensor("token_embd.weight");
  if (embd.shape.size() != 2 || embd.shape[0] != c.n_embd) {
    bad(f, fmt::format("tensor 'token_embd.weight' has rows of {} values; the model's width is {}",
                       embd.shape.empty() ? 0 : embd.shape[0], c.n_embd));
  }
  c.n_vocab = static_cast<int32_t>(embd.shape[1]);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace tireless
