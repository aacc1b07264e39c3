#pragma once
// The one conversion between a request's outcome and its Cap'n Proto form (common.capnp's
// Outcome), used by every actor that ends a request, the server, the load driver and the
// clients. Reason names come from reason_names.hpp's tables. Text and token ids travel
// separately (TokenChunk, the token sink), so they are not part of the wire form.

#include "protocol/common.capnp.h"
#include "tireless/outcome.hpp"

namespace tireless {

void to_wire(const outcome& o, proto::Outcome::Builder b);
outcome from_wire(proto::Outcome::Reader r);

// A token's log-probabilities (common.capnp's TokenLogprob), which travel beside token ids.
void to_wire(const token_logprob& l, proto::TokenLogprob::Builder b);
token_logprob from_wire(proto::TokenLogprob::Reader r);

}  // namespace tireless
