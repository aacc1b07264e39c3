#pragma once
// Between the scheduling cores' plain values and the Cap'n Proto messages the actors send.
// No CAF here.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/backend.hpp"
#include "protocol/owned.hpp"
#include "protocol/runtime.capnp.h"
#include "scheduler/admission_control.hpp"
#include "scheduler/batch_scheduler.hpp"
#include "scheduler/engine_credits.hpp"
#include "scheduler/kv_plan.hpp"

namespace tireless {

owned<proto::KvRequest> to_wire(const kv_request& r);
kv_request from_wire(proto::KvRequest::Reader r);
owned<proto::KvReply> to_wire(const kv_reply& r);
kv_reply from_wire(proto::KvReply::Reader r);

proto::Rejection::Reason to_wire(refusal r);

owned<proto::Credits> to_wire(const engine_credits& c);
engine_credits from_wire(proto::Credits::Reader r);

owned<proto::TokenChunk> to_wire(seq_id seq, const std::vector<token_id>& tokens, int64_t first_token_ns,
                                 const std::vector<token_logprob>& logprobs = {});
// A released request as the engine's batch scheduler takes it, and its degradations.
std::pair<sequence_spec, std::vector<std::string>> sequence_of(proto::GenerateRequest::Reader r);

void set_sampling(proto::Sampling::Builder b, const sampling_params& p);
sampling_params sampling_of(proto::Sampling::Reader r);

// Block tables and penalized sequences' token histories travel as deltas (sequence_step::
// table_from, history_from); `forget`: sequences that ended.
owned<proto::StepRequest> to_wire(uint64_t step_id, const step_batch& batch,
                                  const std::vector<std::pair<block_id, block_id>>& copies,
                                  const std::vector<seq_id>& forget = {});

// The shard's side of a step request: every running sequence's block table, rebuilt from the
// deltas (applying a step twice, as a re-run after a crash does, gives the same tables), and
// the step_batch of the request being run. Its tokens point into the request message, which
// must outlive the batch's use.
struct step_storage {
  std::unordered_map<seq_id, std::vector<int32_t>> tables;
  std::unordered_map<seq_id, std::vector<int32_t>> histories;  // penalized sequences' tokens so far
  std::vector<std::pair<int32_t, int32_t>> copies;
  step_batch batch;
};
// Throws std::runtime_error when a delta starts past the table this storage holds.
void unpack(proto::StepRequest::Reader r, step_storage& out);

owned<proto::StepReply> to_wire(uint64_t step_id, const step_result& r, double seconds);
void unpack(proto::StepReply::Reader r, step_result& out);

}  // namespace tireless
