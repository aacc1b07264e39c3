#pragma once
// The CAF side of the runtime's messages: atoms, and the owned Cap'n Proto messages CAF may
// carry. Include only from actors/*.cpp (CAF headers are heavy to compile).

#include <caf/all.hpp>
#include <string>
#include <utility>
#include <vector>

#include "protocol/common.capnp.h"
#include "protocol/owned.hpp"
#include "protocol/runtime.capnp.h"
#include "actors/admission.hpp"
#include "actors/kv_manager.hpp"
#include "scheduler/engine_core.hpp"

namespace tireless {

using generate_msg = owned<proto::GenerateRequest>;
using tokens_msg = owned<proto::TokenChunk>;
using outcome_msg = owned<proto::Outcome>;
using credits_msg = owned<proto::Credits>;
using kv_request_msg = owned<proto::KvRequest>;
using kv_reply_msg = owned<proto::KvReply>;
using step_request_msg = owned<proto::StepRequest>;
using step_reply_msg = owned<proto::StepReply>;
using expert_request_msg = owned<proto::ExpertRequest>;
using expert_reply_msg = owned<proto::ExpertReply>;

// Atoms (at most 10 characters).
using generate_atom = caf::atom_constant<caf::atom("generate")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using ack_atom = caf::atom_constant<caf::atom("ack")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using attach_atom = caf::atom_constant<caf::atom("attach")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using hold_atom = caf::atom_constant<caf::atom("hold")>;
using finished_atom = caf::atom_constant<caf::atom("finished")>;
using wake_atom = caf::atom_constant<caf::atom("wake")>;

}  // namespace tireless

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::engine_stats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::admission_stats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::kv_stats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::generate_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::tokens_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::outcome_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::credits_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::kv_request_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::kv_reply_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::step_request_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::step_reply_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::expert_request_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tireless::expert_reply_msg)
