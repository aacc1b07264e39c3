#pragma once
// The feed-forward of a mixture-of-experts layer, behind an interface that takes routed
// tokens, so the experts can live in this process or on expert shards elsewhere.

#include <cstdint>
#include <span>

namespace tireless::cpu {

// Tokens of one layer routed to experts: token t goes to experts[t * k + j] with weight
// gates[t * k + j], for slots j < k.
struct routed_tokens {
  int32_t layer = 0;
  const float* x = nullptr;  // [n_tokens][ld], the normalized hidden states
  int64_t n_tokens = 0;
  int64_t ld = 0;
  const int32_t* experts = nullptr;
  const float* gates = nullptr;
  int32_t k = 0;
};

// out[t] = Σ_j gates[t][j] · slots[t * k + j], j = 0..k-1 in order: the one combine, wherever
// the slots were computed.
inline void combine_slots(const routed_tokens& rt, const float* slots, int64_t width, float* out, int64_t ld_out) {
  for (int64_t t = 0; t < rt.n_tokens; ++t) {
    float* o = out + t * ld_out;
    for (int64_t c = 0; c < width; ++c) o[c] = 0.0f;
    for (int32_t j = 0; j < rt.k; ++j) {
      const float gate = rt.gates[t * rt.k + j];
      const float* y = slots + (t * rt.k + j) * width;
      for (int64_t c = 0; c < width; ++c) o[c] += gate * y[c];
    }
  }
}

class expert_ffn {
 public:
  virtual ~expert_ffn() = default;
  // out[t][:n_embd] = Σ_j gates[t][j] · expert_j(x[t]), the slots summed in order j = 0..k-1
  // (so the result does not depend on where each expert ran).
  virtual void run(const routed_tokens& tokens, float* out, int64_t ld_out) = 0;
};

}  // namespace tireless::cpu
