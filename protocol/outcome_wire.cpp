#include "protocol/outcome_wire.hpp"

#include "protocol/reason_names.hpp"

namespace tireless {

void to_wire(const outcome& o, proto::Outcome::Builder b) {
  b.setRequestId(o.request_id);
  switch (o.kind) {
    case outcome_kind::completed: b.initCompleted().setReason(proto::completion_reason(o.reason)); break;
    case outcome_kind::rejected: {
      auto r = b.initRejected();
      r.setReason(proto::rejection_reason(o.reason));
      r.setMessage(o.message);
      r.setRetryAfterMs(o.retry_after_ms);
      r.setRetryToken(o.retry_token);
      break;
    }
    case outcome_kind::cancelled: b.initCancelled().setReason(proto::cancellation_reason(o.reason)); break;
    case outcome_kind::failed: b.initFailed().setMessage(o.message.empty() ? o.reason : o.message); break;
  }
  auto d = b.initDegradations(static_cast<unsigned>(o.degradations.size()));
  for (unsigned i = 0; i < o.degradations.size(); ++i) d.set(i, o.degradations[i]);
  auto u = b.initUsage();
  u.setPromptTokens(o.prompt_tokens);
  u.setCompletionTokens(o.completion_tokens);
  u.setCachedPromptTokens(o.cached_prompt_tokens);
  u.setPreemptions(o.preemptions);
  auto t = b.initTimings();
  t.setQueuedMs(o.queued_ms);
  t.setTimeToFirstTokenMs(o.time_to_first_token_ms);
  t.setTotalMs(o.total_ms);
  t.setLongestPauseMs(o.longest_pause_ms);
}

outcome from_wire(proto::Outcome::Reader r) {
  outcome o;
  o.request_id = r.getRequestId();
  switch (r.which()) {
    case proto::Outcome::COMPLETED:
      o.kind = outcome_kind::completed;
      o.reason = proto::reason_name(r.getCompleted().getReason());
      break;
    case proto::Outcome::REJECTED:
      o.kind = outcome_kind::rejected;
      o.reason = proto::reason_name(r.getRejected().getReason());
      o.message = r.getRejected().getMessage();
      o.retry_after_ms = r.getRejected().getRetryAfterMs();
      o.retry_token = r.getRejected().getRetryToken();
      break;
    case proto::Outcome::CANCELLED:
      o.kind = outcome_kind::cancelled;
      o.reason = proto::reason_name(r.getCancelled().getReason());
      break;
    case proto::Outcome::FAILED:
      o.kind = outcome_kind::failed;
      o.reason = "error";
      o.message = r.getFailed().getMessage();
      break;
  }
  for (auto d : r.getDegradations()) o.degradations.emplace_back(d.cStr());
  if (r.hasUsage()) {
    const auto u = r.getUsage();
    o.prompt_tokens = u.getPromptTokens();
    o.completion_tokens = u.getCompletionTokens();
    o.cached_prompt_tokens = u.getCachedPromptTokens();
    o.preemptions = u.getPreemptions();
  }
  if (r.hasTimings()) {
    const auto t = r.getTimings();
    o.queued_ms = t.getQueuedMs();
    o.time_to_first_token_ms = t.getTimeToFirstTokenMs();
    o.total_ms = t.getTotalMs();
    o.longest_pause_ms = t.getLongestPauseMs();
  }
  return o;
}

void to_wire(const token_logprob& l, proto::TokenLogprob::Builder b) {
  b.setToken(l.token);
  b.setLogprob(l.logprob);
  auto ids = b.initTopTokens(static_cast<unsigned>(l.top.size()));
  auto lps = b.initTopLogprobs(static_cast<unsigned>(l.top.size()));
  for (unsigned i = 0; i < l.top.size(); ++i) {
    ids.set(i, l.top[i].first);
    lps.set(i, l.top[i].second);
  }
}

token_logprob from_wire(proto::TokenLogprob::Reader r) {
  token_logprob l;
  l.token = r.getToken();
  l.logprob = r.getLogprob();
  const auto ids = r.getTopTokens();
  const auto lps = r.getTopLogprobs();
  for (unsigned i = 0; i < ids.size() && i < lps.size(); ++i) l.top.emplace_back(ids[i], lps[i]);
  return l;
}

}  // namespace tireless
