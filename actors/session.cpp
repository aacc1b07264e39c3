#include "actors/session.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "model/model.hpp"
#include "model/text_stopper.hpp"
#include "protocol/outcome_wire.hpp"

namespace tireless {

namespace {

int64_t now_ns(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

struct session_state {
  session_options o;
  std::unique_ptr<text_stopper> stopper;
  std::vector<token_id> stop_tokens;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<token_logprob> logprobs;
  int64_t start_ns = 0;
  int64_t first_token_ns = -1;
  int64_t last_token_ns = -1, longest_pause_ns = 0;  // between two token messages
  int32_t prompt_tokens = 0;
  caf::actor engine;  // learned from the first tokens
};

using self_ptr = caf::stateful_actor<session_state>*;

outcome base_outcome(self_ptr self, outcome_kind kind, std::string reason, std::string message = {}) {
  outcome o;
  o.kind = kind;
  o.reason = std::move(reason);
  o.message = std::move(message);
  o.text = self->state.text;
  o.tokens = self->state.tokens;
  o.logprobs = self->state.logprobs;
  o.prompt_tokens = self->state.prompt_tokens;
  o.completion_tokens = static_cast<int32_t>(self->state.tokens.size());
  o.total_ms = (now_ns(self) - self->state.start_ns) / 1e6;
  if (self->state.first_token_ns >= 0) o.time_to_first_token_ms = (self->state.first_token_ns - self->state.start_ns) / 1e6;
  o.longest_pause_ms = self->state.longest_pause_ns / 1e6;
  return o;
}

// Ends the session with `o` as the request's outcome; tells the request's holder (admission
// or, through it, the engine) to let go when `cancel_downstream`.
void finish(self_ptr self, outcome o, bool cancel_downstream) {
  self->state.o.reporter->report(std::move(o));
  if (cancel_downstream) self->send(self->state.o.admission, cancel_atom::value, self->state.o.reporter->id());
  // The monitors on admission and the engine would stay attached to them until they exit, and
  // their weak reference to this actor keeps its memory (~2 KB) allocated: a leak per request
  // that a soak showed as RSS rising 10% in 30 minutes.
  self->demonitor(self->state.o.admission);
  if (self->state.o.engine) self->demonitor(self->state.o.engine);
  self->quit();
}

// Checks the request and sends it to admission; false when it was refused here.
bool start(self_ptr self) {
  auto& st = self->state;
  st.start_ns = now_ns(self);
  const request& r = st.o.req;
  prepared_prompt prepared;
  if (st.o.prepared) {  // tokenized by the intake already
    prepared = std::move(*st.o.prepared);
  } else if (auto problem = prepare_prompt(r, st.o.lm.get(), st.o.limits, prepared)) {
    finish(self, base_outcome(self, outcome_kind::rejected, problem->reason, std::move(problem->message)), false);
    return false;
  }
  const std::vector<token_id>& prompt = prepared.ids;
  st.stop_tokens = std::move(prepared.stop_tokens);
  st.prompt_tokens = static_cast<int32_t>(prompt.size());
  if (auto problem = check_request(r, st.o.lm.get(), st.prompt_tokens, st.o.limits)) {
    finish(self, base_outcome(self, outcome_kind::rejected, problem->reason, std::move(problem->message)), false);
    return false;
  }
  const int32_t max_tokens = effective_max_tokens(r, st.o.limits);
  if (st.o.lm) st.stopper = std::make_unique<text_stopper>(st.o.lm->tok(), st.stop_tokens, r.stop);

  generate_msg m(static_cast<unsigned>(64 + prompt.size() / 2));
  auto b = m.init();
  b.setRequestId(st.o.reporter->id());
  b.setTenant(st.o.tenant);
  b.setTier(st.o.tier);
  b.setTierPriority(st.o.tier_priority);
  auto p = b.initPrompt(static_cast<unsigned>(prompt.size()));
  for (unsigned i = 0; i < prompt.size(); ++i) p.set(i, prompt[i]);
  set_sampling(b.initSampling(), sampling_params_of(r.sampling));
  b.setMaxTokens(max_tokens);
  auto stops = b.initStopTokens(static_cast<unsigned>(st.stop_tokens.size()));
  for (unsigned i = 0; i < st.stop_tokens.size(); ++i) stops.set(i, st.stop_tokens[i]);
  b.setArrivalNs(st.start_ns);
  b.setRetryToken(r.retry_token);
  if (r.timeout.count() > 0) b.setDeadlineNs(st.start_ns + std::chrono::nanoseconds(r.timeout).count());
  b.setTokenWindow(r.token_window);
  // The deadline timer is armed by admission once it takes the request in: a request it
  // refuses at once needs none (and refusing is what an overloaded server does most).
  self->send(st.o.admission, generate_atom::value, std::move(m), caf::actor_cast<caf::actor>(self));
  return true;
}

void on_tokens(self_ptr self, const tokens_msg& msg) {
  auto& st = self->state;
  if (!st.engine) st.engine = caf::actor_cast<caf::actor>(self->current_sender());
  const auto r = msg.get();
  const int64_t now = now_ns(self);
  if (st.first_token_ns < 0) st.first_token_ns = now;
  if (st.last_token_ns >= 0) st.longest_pause_ns = std::max(st.longest_pause_ns, now - st.last_token_ns);
  st.last_token_ns = now;
  token_event e;
  e.request_id = st.o.reporter->id();
  bool stop_string = false;
  for (token_id t : r.getTokens()) {
    st.tokens.push_back(t);
    e.tokens.push_back(t);
    if (!st.stopper) continue;
    const bool stop_token = std::find(st.stop_tokens.begin(), st.stop_tokens.end(), t) != st.stop_tokens.end();
    auto piece = st.stopper->push(t);
    e.text += piece.text;
    if (piece.stopped && !stop_token) stop_string = true;
  }
  for (auto l : r.getLogprobs()) e.logprobs.push_back(from_wire(l));
  st.logprobs.insert(st.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  st.text += e.text;
  st.o.reporter->tokens(e);
  if (stop_string) {
    finish(self, base_outcome(self, outcome_kind::completed, "stop_string"), true);
    return;
  }
  if (st.o.req.token_window > 0 && !st.o.req.manual_ack && st.engine) {
    self->send(st.engine, ack_atom::value, st.o.reporter->id(), static_cast<int32_t>(r.getTokens().size()));
  }
}

// The engine's or admission's outcome, with what the session saw itself: the text, the tokens
// and the times on its clock.
void on_outcome(self_ptr self, const outcome_msg& msg) {
  auto& st = self->state;
  const outcome from = from_wire(msg.get());
  if (from.kind == outcome_kind::completed && st.stopper) {
    // Text held back (a possible stop string, an unfinished character) goes to the stream too,
    // so a streamed answer ends as the whole one does.
    token_event tail;
    tail.request_id = st.o.reporter->id();
    tail.text = st.stopper->finish();
    if (!tail.text.empty()) {
      st.text += tail.text;
      st.o.reporter->tokens(tail);
    }
  }
  outcome o = base_outcome(self, from.kind, from.reason, from.message);
  o.retry_after_ms = from.retry_after_ms;
  o.retry_token = from.retry_token;
  o.degradations = from.degradations;
  o.cached_prompt_tokens = from.cached_prompt_tokens;
  o.preemptions = from.preemptions;
  if (from.completion_tokens > 0) o.completion_tokens = from.completion_tokens;
  o.queued_ms = from.queued_ms;
  finish(self, std::move(o), false);
}

caf::behavior session(self_ptr self, session_options o) {
  self->state.o = std::move(o);
  if (!start(self)) return {};
  // A request must end even if the runtime's own actors stop under it.
  self->monitor(self->state.o.admission);
  if (self->state.o.engine) self->monitor(self->state.o.engine);
  self->set_down_handler([=](caf::down_msg& dm) {
    finish(self, base_outcome(self, outcome_kind::failed, "error",
                              "the runtime stopped serving this request (" + caf::to_string(dm.reason) + ")"),
           false);
  });
  return {
      [=](const tokens_msg& m) { on_tokens(self, m); },
      [=](const outcome_msg& m) { on_outcome(self, m); },
      [=](deadline_atom) {
        finish(self, base_outcome(self, outcome_kind::cancelled, "deadline",
                                  "the request's timeout passed before it finished"), true);
      },
      [=](ack_atom, int32_t n) {  // manual_ack: the host's consumer took n tokens
        if (self->state.engine) self->send(self->state.engine, ack_atom::value, self->state.o.reporter->id(), n);
      },
      [=](cancel_atom, int32_t why) {
        finish(self, base_outcome(self, outcome_kind::cancelled, why == 1 ? "shutdown" : "client"), true);
      },
  };
}

}  // namespace

caf::actor spawn_session(caf::actor_system& sys, session_options options) {
  return sys.spawn(session, std::move(options));
}

}  // namespace tireless
