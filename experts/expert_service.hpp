#pragma once
// What an expert shard does with one ExpertRequest: decode the routed tokens, run each
// (row, expert) pair through its expert, encode the outputs. The same code serves an expert
// shard actor in the engine's process and a tireless-shard process over Cap'n Proto RPC.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "protocol/runtime.capnp.h"

namespace tireless {

class model;
namespace cpu {
class local_experts;
class thread_pool;
}  // namespace cpu

// Activations on the wire, rows of `width` values: f32 as they are, f16 rounded to IEEE half,
// int8 with one f32 scale per row (symmetric, max |x| / 127). decode throws
// std::invalid_argument when the bytes are not whole rows of out's size.
void encode_activations(proto::Activations a, std::span<const float> v, size_t width, capnp::Data::Builder out);
void decode_activations(proto::Activations a, capnp::Data::Reader in, size_t width, std::span<float> out);
size_t activation_row_bytes(proto::Activations a, size_t width);

class expert_service {
 public:
  // Holds `experts` of every layer (all when empty); computes with `threads` CPU threads, at
  // most max_pairs (token, expert) pairs per request.
  expert_service(std::shared_ptr<const model> m, int threads, int64_t max_pairs, std::vector<int32_t> experts);
  ~expert_service();

  // Throws std::invalid_argument (a request that does not fit this model or names an expert
  // not held here).
  void serve(proto::ExpertRequest::Reader request, proto::ExpertReply::Builder reply);
  void hold(const std::vector<int32_t>& keys);  // layer * n_expert + expert
  std::vector<int32_t> held() const;
  const model& lm() const { return *model_; }

 private:
  std::shared_ptr<const model> model_;
  std::unique_ptr<cpu::thread_pool> pool_;
  std::unique_ptr<cpu::local_experts> experts_;
  int64_t max_pairs_;
  std::vector<float> x_, y_;
};

}  // namespace tireless
