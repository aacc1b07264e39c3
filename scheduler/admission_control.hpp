#pragma once
// Admission's decisions, CAF-free: who is refused at arrival and why, what is degraded, and
// who goes to the engine next. Four policies, selectable so they can be compared in one run:
//   fcfs      one unbounded FIFO, no tiers: a server without admission control
//   priority  strict tier priority, FIFO inside a tier, bounded queues (vLLM's priority
//             scheduling with a queue limit)
//   tireless  tier priority; tenant quotas as token buckets; weighted deficit round robin by
//             tokens between a tier's tenants; early rejection of sheddable requests whose
//             predicted time to first token misses the tier's target (Mooncake's
//             prediction-based rejection); degradation ladders; bounded queues
//   least-slack  the SLO-aware peer without admission control: nothing refused, every
//             request gets its tier's deadlines, released by earliest first-token deadline
//             and prefilled by least slack across tiers (no tier priority)
// Every refusal carries a reason and, when waiting helps, retry_after_ms.

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/runtime_config.hpp"
#include "scheduler/engine_credits.hpp"
#include "scheduler/engine_load.hpp"
#include "scheduler/moving_rate.hpp"
#include "scheduler/prefix_index.hpp"
#include "scheduler/retry_book.hpp"
#include "scheduler/token_bucket.hpp"

namespace tireless {

struct arrival {
  uint64_t id = 0;
  std::string tenant;  // "" when the configuration has no tenants
  std::string tier;
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int64_t now_ns = 0;
  // Its tokens, when known (empty: only prompt_tokens is): the prefix admission sent the engine
  // before is expected cached there (prefix_index), and its feasibility is judged by the rest.
  std::span<const token_id> prompt{};
  // Of those, the tokens expected in the prefix cache: admission looks them up (any value given
  // is replaced); -1: unknown (no prompt, or no index), its tier's share of them lately.
  int32_t cached_tokens = -1;
  // The token of an earlier refusal of this tenant's (admission_decision::retry_token): a
  // client back at the time it was told holds the reservation that came with it.
  uint64_t retry_token = 0;
};

enum class refusal { overloaded, quota_exceeded, prompt_too_long, invalid };

struct admission_decision {
  bool admitted = false;
  int32_t max_tokens = 0;                 // admitted: after any cap
  int32_t priority = 0;                   // admitted: the engine's priority (0 for all under fcfs)
  // admitted: the deadlines the engine schedules by (tireless: the tier's targets; 0: none,
  // the engine keeps arrival order within a priority)
  std::chrono::nanoseconds ttft_target{0}, tpot_target{0};
  // admitted: how long after arrival it may still start (a sheddable tier's start bound); 0: no limit
  std::chrono::nanoseconds start_within{0};
  std::vector<std::string> degradations;  // admitted: what was done, for the outcome
  int32_t cached_tokens = 0;              // admitted: prompt tokens expected in the prefix cache
  refusal reason = refusal::overloaded;   // refused
  std::string message;
  int64_t retry_after_ms = -1;
  // refused for load with a retry hint: a reservation for the client's return. Sent back with
  // the retry (arrival::retry_token) at or after retry_after_ms, and within its window, it is
  // admitted without being shed: the work it reserved was counted ahead of every newcomer.
  uint64_t retry_token = 0;
};

struct queued_request {
  uint64_t id = 0;
  std::string tenant, tier;
  int32_t prompt_tokens = 0, max_tokens = 0;
  int32_t cached_tokens = -1;  // of the prompt, expected in the prefix cache (arrival::cached_tokens)
  int64_t arrival_ns = 0;
  int64_t start_within_ns = 0;  // its start bound after arrival (admission_decision::start_within); 0: none
};

class admission_control {
 public:
  // book: the retry reservations, shared with the engine (a book of its own when null).
  admission_control(admission_policy kind, const admission_settings& settings,
                   std::vector<tier_settings> tiers, std::vector<tenant_settings> tenants,
                   std::shared_ptr<retry_book> book = nullptr);
  // Expect the engine's prefix cache to hold the leading blocks of the prompts sent to it (of
  // block_size tokens, the pool's capacity_blocks at most): a prompt is judged by its part the
  // cache is not expected to hold. Without it: every prompt by its whole length.
  void index_prefixes(int32_t block_size, int64_t capacity_blocks) { prefixes_ = prefix_index(block_size, capacity_blocks); }

  // Refuses the request, or queues it (admitted).
  admission_decision arrive(const arrival& a);
  // The refusal arrive(a) would give now, or nothing when it would queue the request. Nothing
  // is queued; a refusal's retry hint is promised as arrive's is (see promised_).
  std::optional<admission_decision> refusal(const arrival& a);
  // Whether arrive(a) would refuse now; nothing is queued or promised.
  bool would_refuse(const arrival& a);
  // The next request for the engine, in policy order (removed from its queue).
  std::optional<queued_request> next(int64_t now_ns = 0);  // now_ns: the clock of arrivals (0: the latest seen)
  // The engine priority of the request next() would return, if any.
  std::optional<int32_t> peek_priority() const;
  // A queued request left (cancelled or expired); its reservation is returned.
  bool cancel(uint64_t id, int64_t now_ns);
  // A released request ended having used `used_tokens` (prompt + generated): the unused part
  // of its token reservation goes back to its tenant; its concurrency slot frees.
  void finished(uint64_t id, int32_t used_tokens, int64_t now_ns);
  // Queued requests that waited longer than max_queue_wait: removed, to be refused.
  std::vector<queued_request> expire(int64_t now_ns);
  // Queued requests of sheddable tiers that can no longer have their first token within their
  // start bound (admission_decision::start_within: their prefill alone, on an idle engine,
  // would end past it; policy tireless): removed, to be refused before any prefill is spent on
  // them. Rare by design (refusal at arrival is the normal path): counted.
  struct late_request {
    queued_request q;
    int64_t bound_ms = 0;        // its tier's start bound
    int64_t retry_after_ms = 0;  // when the work ahead would let it meet its target
    uint64_t retry_token = 0;    // its reservation for that time
  };
  std::vector<late_request> too_late_to_start(int64_t now_ns);
  // A released request the engine refuses unstarted, past its start bound: when it should
  // come back (the forecast of the work ahead now, that queued here and the returns reserved
  // before it included) and the reservation for that return. Nothing when `id` is not held.
  std::optional<retry_promise> retry_after_late_start(uint64_t id, int64_t now_ns);
  int64_t late_refusals() const { return late_refusals_; }
  void observe(const engine_load& load) { load_ = load; }
  // The engine's credits: its load, and which of the requests released to it it had received
  // (those on their way take seats ahead too).
  void observe(const engine_credits& credits);

  // Predicted seconds from arrival to the first token of a request of this tier and prompt,
  // with extra_tokens more prompt work ahead of it. own_work_only: only the work at its tier
  // and above holds it back (not running requests of lower tiers that fill the batch; the
  // engine places higher tiers first).
  double predicted_ttft(const std::string& tier, int32_t prompt_tokens, double extra_tokens = 0,
                        bool own_work_only = false) const;
  // Seconds the prompt's prefill takes on an idle engine (0 until steps were measured), and
  // the longest prompt whose idle prefill fits `seconds`.
  double idle_prefill(int32_t prompt_tokens) const;
  int32_t longest_prompt_within(double seconds) const;
  // Whether `prompt_tokens` more prompt work at `tier` would make a lower tier's next
  // request miss its first-token target.
  bool displaces_lower_tiers(const tier_settings& tier, int32_t prompt_tokens) const;
  std::vector<std::pair<std::string, int32_t>> queued_by_tier() const;
  int32_t queued() const;
  admission_policy kind() const { return kind_; }

 private:
  struct tenant_state {
    const tenant_settings* settings = nullptr;
    token_bucket requests, tokens;
    int32_t concurrent = 0;     // queued + running
  };
  struct tenant_queue {         // a tenant's queued requests in one tier (tireless)
    std::deque<uint64_t> ids;
    std::deque<int64_t> arrivals;  // ids' arrival times (ns), in the same order
    double deficit = 0;         // weighted deficit round robin, in tokens
    double weight = 1.0;
  };
  // The first of q's requests (an index) still able to start within its tier's first-token
  // target, now; 0 if none is.
  size_t first_on_time(const tenant_queue& q, const tier_settings& ts) const;
  // The windows of the arrival rates (seconds): long enough to hold a few of a small tier's
  // arrivals, short enough to follow a ramp; and of a tier's offered load: long enough that its
  // own Poisson bursts do not read as a tier over its capacity (10 s did, at 60% of it).
  static constexpr double arrival_window_s = 10.0;
  static constexpr double offered_window_s = 30.0;
  struct tier_state {
    const tier_settings* settings = nullptr;
    std::deque<uint64_t> fifo;         // fcfs / priority order
    std::deque<std::string> rotation;  // tenants with queued requests (tireless)
    std::unordered_map<std::string, tenant_queue> tenants;
    int32_t queued = 0;
    int64_t queued_prompt_tokens = 0;
    int64_t queued_later_tokens = 0;  // of those, infeasible prompts' (prefilled after the others)
    // Prompt tokens admitted per second: the work of this tier that arrives while a lower
    // tier's request waits; and the tokens those requests are expected to generate (the tier's
    // mean lately, at most their max_tokens; none until one finished): the decodes they bring.
    moving_rate arriving{arrival_window_s}, arriving_decodes{arrival_window_s};
    // Prompt tokens offered per second (admitted or not): the tier's own load.
    moving_rate offered{offered_window_s};
    double generated_mean = -1;  // tokens its requests generated, a moving average (-1: none ended)
  };
  struct holding {
    queued_request q;
    double reserved = 0;  // tokens reserved against the tenant's per-minute quota
    bool queued = true;
    bool later = false;   // infeasible: prefilled after its tier's feasible prompts
  };

  // `a` with arrival::cached_tokens looked up.
  arrival looked_up(const arrival& a) const;
  admission_decision decide(const arrival& a, bool promise = true);
  // tireless: the arrival against its tier's forecast and degradation ladder; a refusal, or
  // none with d filled in. hold_start_bound: a tier that is not shed, against its start bound
  // (idle: an infeasible prompt's own prefill on an idle engine, else 0).
  std::optional<admission_decision> judge_by_forecast(const arrival& a, tier_state& tier, admission_decision& d,
                                                      bool promise);
  std::optional<admission_decision> hold_start_bound(const arrival& a, const tier_state& tier, double idle, bool promise);
  // Refused as overloaded, with the hint until `a` would be predicted within within_seconds
  // and, when `reserve`, a reservation for its return; message(hint) says why.
  template <class Message>
  admission_decision refuse_overloaded(const tier_settings& ts, const arrival& a, double within_seconds, bool promise,
                                       bool reserve, Message&& message);
  // The share of a new prompt of this engine priority the prefix cache is not expected to hold.
  double uncached_share(int32_t engine_priority) const;
  // predicted_ttft() with the pace of a prompt token at that priority.
  // returns: clients due back before it (work_ahead::returns). cached: of its prompt, the
  // tokens expected in the prefix cache (-1: unknown, its tier's share of them lately).
  first_token_forecast forecast(const std::string& tier, int32_t prompt_tokens, double extra_tokens,
                                bool own_work_only, double returns = 0, int32_t cached = -1) const;
  std::optional<admission_decision> check_quotas(tenant_state& t, const arrival& a, int32_t max_tokens);
  // The wait until `a` would be predicted within target_seconds, and the reservation for its
  // return (its token in *token).
  int64_t retry_hint_ms(const tier_settings& tier, const arrival& a, double target_seconds, bool promise,
                        uint64_t* token = nullptr);
  retry_promise promise_return(const queued_request& q, int64_t now_ns);
  tenant_state& tenant_of(const std::string& name);
  std::optional<queued_request> next_in_tier(tier_state& t);
  void dequeue(const holding& h);
  queued_request release(holding& h);  // to the engine: no longer queued here
  int32_t engine_priority(const tier_settings& tier) const;  // the priority the engine runs its requests at
  // How long a request holds its seat in the batch, expected, while no completion was measured
  // (work_ahead::seat_seconds); 0 once one was.
  double seat_seconds() const;
  tier_state& tier_of(const std::string& name);
  const tier_state& tier_of(const std::string& name) const;
  double service_seconds() const;

  admission_policy kind_;
  admission_settings settings_;
  std::vector<tier_settings> tiers_;    // highest priority first
  std::vector<tenant_settings> tenants_;
  tenant_settings anonymous_;           // requests without a configured tenant share its queue
  std::vector<tier_state> tier_states_; // parallel to tiers_
  std::unordered_map<std::string, tenant_state> tenant_states_;
  std::unordered_map<uint64_t, holding> held_;  // queued or released, until finished
  std::deque<uint64_t> arrivals_;               // fcfs order
  // Reservations for the returns of refused clients (shared with the engine, whose late
  // refusals reserve too). A client told to come back at t finds the work of those told to
  // come back before it still ahead, so hints are staggered and a herd of refused clients does
  // not return at once into the same wall; one back in time with its token is not shed.
  std::shared_ptr<retry_book> book_;
  prefix_index prefixes_;  // the prompts admitted for the engine (index_prefixes)
  bool holds_reservation(const arrival& a) const;
  engine_load load_;
  // Requests released by engine priority, ever, and those the engine said it received; the
  // difference is on its way (counted once the engine's credits were observed).
  std::map<int32_t, int64_t> sent_, received_;
  bool counts_received_ = false;
  // Of the requests held (queued or released): their prompts and the tokens they may generate.
  int64_t held_prompt_tokens_ = 0, held_max_tokens_ = 0;
  int64_t late_refusals_ = 0;
  int64_t now_ns_ = 0;  // of the latest arrival
  int64_t observing_since_ns_ = -1;  // the first arrival: the moving rates are read from then
};

}  // namespace tireless
