// Admitted requests that can no longer start in time: refused before any prefill is spent on
// them (policy tireless), and the return each is promised. admission_control.cpp holds the rest.
#include "scheduler/admission_control.hpp"

#include <algorithm>

namespace tireless {

std::vector<admission_control::late_request> admission_control::too_late_to_start(int64_t now_ns) {
  std::vector<late_request> out;
  if (kind_ != admission_policy::tireless) return out;
  for (auto& [id, h] : held_) {
    if (!h.queued || h.q.start_within_ns <= 0) continue;
    const double prefill_ns = idle_prefill(h.q.prompt_tokens - std::max(h.q.cached_tokens, 0)) * 1e9;
    if (static_cast<double>(now_ns - h.q.arrival_ns) + prefill_ns > static_cast<double>(h.q.start_within_ns)) {
      out.push_back({h.q, h.q.start_within_ns / 1'000'000, 0});
    }
  }
  for (late_request& l : out) {
    cancel(l.q.id, now_ns);  // first: its own prompt is no longer ahead of anyone
    const retry_promise p = promise_return(l.q, now_ns);
    l.retry_after_ms = p.retry_after_ms;
    l.retry_token = p.retry_token;
  }
  late_refusals_ += static_cast<int64_t>(out.size());
  return out;
}

std::optional<retry_promise> admission_control::retry_after_late_start(uint64_t id, int64_t now_ns) {
  auto it = held_.find(id);
  if (it == held_.end() || kind_ != admission_policy::tireless) return std::nullopt;
  return promise_return(it->second.q, now_ns);
}

// An admitted request refused unstarted: back when a request like it would meet its target.
retry_promise admission_control::promise_return(const queued_request& q, int64_t now_ns) {
  const tier_settings& ts = *tier_of(q.tier).settings;
  arrival a{q.id, q.tenant, q.tier, q.prompt_tokens, q.max_tokens, now_ns};
  a.cached_tokens = q.cached_tokens;
  retry_promise p;
  p.retry_after_ms = retry_hint_ms(ts, a, std::chrono::duration<double>(ts.ttft).count(), true, &p.retry_token);
  return p;
}

}  // namespace tireless
