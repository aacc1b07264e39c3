#include "model/model_tensors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/gguf_file.hpp"

namespace tireless {

namespace {

class finder {
 public:
  finder(const gguf_file& f) : f_(f) {}

  const gguf_tensor* get(const std::string& name, std::vector<int64_t> shape, bool matrix) const {
    const gguf_tensor& t = f_.tensor(name);
    if (t.shape != shape) {
      throw gguf_error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}] for this "
                                   "model's configuration",
                                   f_.path().string(), name, fmt::join(t.shape, ", "),
                                   fmt::join(shape, ", ")));
    }
    if (!matrix && t.type != tensor_type::f32) {
      throw gguf_error(fmt::format("{}: tensor '{}' is {}, expected f32 (norm weights)",
                                   f_.path().string(), name, name_of(t.type)));
    }
    if (matrix && is_quantized(t.type) && t.shape[0] % 32 != 0) {
      throw gguf_error(fmt::format("{}: tensor '{}' has rows of {} values, not a multiple of the "
                                   "32-value block of {}",
                                   f_.path().string(), name, t.shape[0], name_of(t.type)));
    }
    return &t;
  }

 private:
  static std::string name_of(tensor_type t) { return std::string(name(t)); }
  const gguf_file& f_;
};

}  // namespace

model_tensors model_tensors::from_gguf(const gguf_file& f, const model_config& c) {
  const finder find(f);
  model_tensors m;
  const int64_t e = c.n_embd, v = c.n_vocab, ff = c.n_ff, x = c.n_expert;
  m.token_embd = find.get("token_embd.weight", {e, v}, true);
  m.output_norm = find.get("output_norm.weight", {e}, false);
  m.output = c.tied_embeddings ? m.token_embd : find.get("output.weight", {e, v}, true);
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = fmt::format("blk.{}.", i);
    layer_tensors l;
    l.attn_norm = find.get(p + "attn_norm.weight", {e}, false);
    l.wq = find.get(p + "attn_q.weight", {e, c.q_dim()}, true);
    l.wk = find.get(p + "attn_k.weight", {e, c.kv_dim()}, true);
    l.wv = find.get(p + "attn_v.weight", {e, c.kv_dim()}, true);
    l.wo = find.get(p + "attn_output.weight", {c.q_dim(), e}, true);
    l.ffn_norm = find.get(p + "ffn_norm.weight", {e}, false);
    if (c.is_moe()) {
      l.ffn_gate_inp = find.get(p + "ffn_gate_inp.weight", {e, x}, true);
      l.ffn_gate_exps = find.get(p + "ffn_gate_exps.weight", {e, ff, x}, true);
      l.ffn_up_exps = find.get(p + "ffn_up_exps.weight", {e, ff, x}, true);
      l.ffn_down_exps = find.get(p + "ffn_down_exps.weight", {ff, e, x}, true);
    } else {
      l.ffn_gate = find.get(p + "ffn_gate.weight", {e, ff}, true);
      l.ffn_up = find.get(p + "ffn_up.weight", {e, ff}, true);
      l.ffn_down = find.get(p + "ffn_down.weight", {ff, e}, true);
    }
    m.layers.push_back(l);
  }
  return m;
}

}  // namespace tireless
