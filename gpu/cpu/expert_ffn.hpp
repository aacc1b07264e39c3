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

  // Overlap (ping-pong): start() sends a micro-batch's tokens on `lane` and returns at once;
  // finish() waits for them and combines. Between the two, the caller may compute the other
  // lane's attention; tokens' arrays must stay as they are until finish(). One call per lane
  // in flight. Where the experts share the caller's CPUs there is nothing to overlap with:
  // overlaps() is false and finish() simply runs.
  virtual bool overlaps() const { return false; }
  virtual void start(const routed_tokens& /*tokens*/, int /*lane*/) {}
  virtual void finish(const routed_tokens& tokens, int /*lane*/, float* out, int64_t ld_out) { run(tokens, out, ld_out); }
  // After a failed step: waits for and drops a lane's call in flight, if any.
  virtual void abandon(int /*lane*/) {}
};

}  // namespace tireless::cpu
