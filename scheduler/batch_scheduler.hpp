#pragma once
// The engine's continuous batching, CAF-free. A step is
//   kv_request r = propose();          what the step would like (order = keep priority)
//   step_batch b = finalize(reply);    what the KV pool granted, as the backend's input
//   events e = commit(result, now);    tokens, finished requests
// Policy lives in propose(): higher tiers first; within a tier decode tokens before prefill
// chunks under a per-step token budget (chunked prefill), and prefill by earliest deadline
// (several prompts' chunks in a step), then prompts without a deadline, then those that
// cannot meet theirs even on an idle engine (infeasible), oldest first; a
// lower tier's decode yields to a higher tier's work only while its own next token is not
// due, and when a prompt would miss its first-token deadline, the decodes of its own tier and
// below yield to it within their slack (never for longer than longest_pause_ns). The KV order (what is kept last) stays running before waiting within a priority,
// older first, paused requests (slow clients) last, so they are the first to give their
// blocks back.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/backend.hpp"
#include "scheduler/engine_load.hpp"
#include "scheduler/kv_plan.hpp"
#include "scheduler/step_time_model.hpp"

namespace tireless {

struct scheduler_limits {
  int32_t max_step_tokens = 512;
  int32_t max_step_seqs = 64;
  int32_t max_preemptions = 3;   // then a request is protected from preemption (last resort only)
  int32_t max_context = 8192;
  int32_t block_size = 16;       // of the KV pool: full blocks are offered to the prefix cache
  // Prefill by least slack (the deadline less the prompt's remaining prefill on an idle
  // engine), infeasible prompts included: the least-slack peer policy. Default: earliest
  // deadline first, infeasible prompts last.
  bool least_slack = false;
  // Within a tier, when its feasible prompts cannot all meet their deadlines together, the
  // longest unstarted ones go last, so that the most of them are on time (see prefill_order;
  // not with least_slack).
  bool most_on_time = true;
};

// Prompt tokens a step computes whatever its time budget, while a prompt waits: the least
// prefill progress a step makes (admission's predictions count on it).
constexpr int32_t min_step_prefill_tokens = 16;

// A step's time budget, by a model of step cost; seconds = 0: only max_step_tokens limits it.
struct step_time_budget {
  double seconds = 0;
  double c0 = 0, per_prefill_token = 0, per_decode = 0, per_context_position = 0;
  double headroom = 1;  // seconds is this share of the time target (for the model's error)
  // Of the pause the streams may wait, the share a step stretched past the budget may take
  // (for the model's error on such steps); with headroom, the lesser of the two.
  double stretch_headroom = 1;
};

// A step runs longer than its budget only while a waiting prompt's first-token deadline would
// be missed at the budget's pace, and only as long as every decode in it can wait (it is ahead
// of its one-token-per-TPOT deadline, and no pause past longest_pause_ns): then as long as the
// prompts in line up to that one take in one step (at most a max_step_tokens chunk), as on an
// idle engine, so a prompt an idle engine could put on time loses no step overhead to the
// decodes beside it when they have the slack to wait. A stream never pauses longer than its
// tier's first-token target, nor than this many of its TPOTs:
constexpr double max_step_stretch = 3.0;

// Seconds a prompt's prefill takes on an idle engine, in chunks of max_step_tokens, by the
// budget's cost model (0 without one). Longer than its tier's first-token target: the
// request is infeasible, whatever the load.
double idle_prefill_seconds(int32_t prompt_tokens, const step_time_budget& time, int32_t max_step_tokens);

struct sequence_spec {
  seq_id id = 0;
  int32_t priority = 0;          // higher is more important
  uint64_t arrival = 0;          // smaller arrived earlier
  std::vector<token_id> prompt;
  sampling_params sampling;
  int32_t max_tokens = 16;
  std::vector<token_id> stop_tokens;
  int32_t token_window = 0;      // tokens it may emit before the client acknowledges; 0: no limit
  // Deadlines, on the clock of `arrival` and of propose()/commit()'s `now` (nanoseconds): the
  // first token by arrival + ttft_target_ns, then one token per tpot_target_ns (the k-th
  // after the first by first token + k * tpot_target_ns). 0: none (ordered by arrival).
  int64_t ttft_target_ns = 0;
  int64_t tpot_target_ns = 0;
  int64_t start_by = 0;  // not started by then: taken out by take_late() unstarted; 0: never
  // Of the prompt, the leading tokens the prefix cache is expected to hold when it is placed
  // (admission's prefix index): until then its prefill is judged by the rest (feasibility,
  // deadlines, the step's token budget); the KV pool's grant says what it really holds.
  int32_t expected_cached = 0;
};

// A first token later than this many times its tier's target after arrival is "late": the
// line a request of a tier that is never refused after admission is still scheduled by once it
// missed its target (the default start bound of a sheddable tier is the same).
constexpr double late_after_targets = 2.0;

// The reservation of KV blocks for running requests' answers (batch_scheduler::may_start): the
// share of its remaining answer a running request is expected to write is the 90th percentile
// of what the last answers wrote of theirs (all of it until 32 ended), at least the least; a
// preemption (the reservation fell short) adds the bump, which wears off over 200 steps.
constexpr double kv_growth_quantile = 0.9, kv_growth_ratio_min = 0.1;
constexpr double kv_growth_bump = 0.2, kv_growth_bump_decay = kv_growth_bump / 200;  // per preemption, per step
constexpr int32_t kv_growth_clip = 4096;  // answer tokens counted at most

// The longest a running stream waits for its next token, however far ahead of its deadline
// it is: what its tier promises for the first token, and at least max_step_stretch TPOTs.
int64_t longest_pause_ns(const sequence_spec& spec);

enum class finish_reason { stop_token, max_tokens, context_full, cancelled };

struct scheduler_event {
  enum class kind { tokens, finished, preempted } what;
  seq_id seq = 0;
  std::vector<token_id> tokens;   // kind::tokens
  finish_reason reason{};         // kind::finished
  // kind::finished: what the request used.
  int32_t prompt_tokens = 0, generated = 0, cached_tokens = 0, preemptions = 0;
  std::vector<token_logprob> logprobs{};  // kind::tokens, one per token when the request asked
};

struct sequence_counts {
  int32_t waiting = 0, running = 0, paused = 0;
  int64_t running_context = 0;    // positions held by running requests, summed
  std::vector<tier_load> tiers;   // by priority, highest first
};

class batch_scheduler {
 public:
  explicit batch_scheduler(scheduler_limits limits) : limits_(limits) {}

  void add(sequence_spec spec);
  // Ends a request: it leaves the batch, its blocks are released with the next request.
  // Returns false when the sequence is unknown (already finished).
  bool cancel(seq_id seq);
  // Waiting requests that were never started and can no longer have their first token by their
  // start_by (their prefill, started now, would end past it: at the pace steps of `time`'s
  // budget leave it beside the decodes of its tier and above, or on an idle engine where that
  // is longer): removed (nothing of theirs was computed), to be refused. Call before propose().
  std::vector<seq_id> take_late(int64_t now, const step_time_budget& time = step_time_budget{});
  // The client acknowledged `tokens` more tokens: the window grows by that many.
  void acknowledge(seq_id seq, int32_t tokens);

  // Work is packed in keep order (a higher tier's decodes and prefill before a lower tier's)
  // until the step would exceed the budget.
  // `now` is on the sequences' clock (see sequence_spec's deadlines).
  kv_request propose(const step_time_budget& budget = step_time_budget{}, int64_t now = 0);
  step_batch finalize(const kv_reply& reply);
  std::vector<scheduler_event> commit(const step_result& result, int64_t now = 0);

  bool has_work() const;          // something could run if blocks allow
  // The KV pool's last answer changed what propose() would plan (it refused a prompt it had
  // not refused since blocks last came back, or it preempted): true once, then false until
  // the next such answer. A step that ran nothing proposes again then.
  bool take_replan() { return std::exchange(replan_, false); }
  // When, with no event meanwhile, propose() would first plan differently: a waiting request
  // reaches its start bound, or a stream that yields comes due (on the sequences' clock, at
  // least a step after `now`); none without deadlines. A step that ran nothing proposes again
  // then, so no request waits on an event that never comes.
  std::optional<int64_t> wake_at(int64_t now, const step_time_budget& time) const;
  bool knows(seq_id seq) const { return seqs_.count(seq) != 0; }
  // Whether its prompt, on an idle engine by `time`'s model, cannot meet its first-token target
  // (of what its prefill computes: less what the cache holds, or is expected to hold).
  bool infeasible(seq_id seq, const step_time_budget& time) const;
  // `time`: the model by which a prompt is infeasible (none: every prompt counts as feasible).
  sequence_counts counts(const step_time_budget& time = step_time_budget{}) const;
  int32_t preemptions(seq_id seq) const;
  int32_t cached_tokens(seq_id seq) const;
  // Tokens the sequence holds (prompt and generated), 0 when unknown.
  int32_t tokens_of(seq_id seq) const;
  // Sequences that ended or lost their blocks since the last call: the shard may drop its
  // copy of their block tables (steps carry tables as deltas, sequence_step::table_from).
  std::vector<seq_id> take_forgotten() { return std::exchange(forgotten_, {}); }

 private:
  struct sequence {
    sequence_spec spec;
    std::vector<token_id> tokens;  // prompt, then generated
    int32_t computed = 0;          // positions whose KV is in the cache
    int32_t generated = 0;
    bool running = false;          // holds blocks
    int32_t window = 0;            // tokens it may still emit; meaningful when spec.token_window > 0
    int32_t preemptions = 0;
    int32_t cached_tokens = 0;
    int32_t placed_cached = -1;    // prompt tokens the prefix cache held at its first placement (-1: not placed)
    int32_t held_positions = 0;    // positions its blocks hold (granted; never asked to shrink)
    int32_t committed_blocks = 0;  // full blocks already offered to the prefix cache
    std::vector<block_id> table;
    int32_t shard_has = 0;         // leading table entries the shard got in earlier steps
    int32_t shard_history = 0;     // leading tokens the shard got for the penalties, likewise
    int64_t first_token_at = -1;   // the `now` of the commit that produced it
    int64_t last_token_at = -1;    // likewise, of its latest token
    // The release epoch (batch_scheduler::release_epoch_) in which the KV pool refused to
    // admit it or preempted it: until a request ends, it waits unproposed, so no stream yields
    // to a prompt that cannot start, and a sequence the pool could not grow is not taken back
    // in (its prefix cached) only to be preempted again (and the blocks it gives back do not
    // let another in for the same round trip: a livelock of the waiting, found by random runs).
    uint64_t refused_epoch = std::numeric_limits<uint64_t>::max();
    bool paused() const { return spec.token_window > 0 && window <= 0; }
    // The position its next step computes from: `computed` while it holds blocks; before, what
    // the prefix cache is expected to hold of it (sequence_spec::expected_cached).
    int32_t expected_start() const;
    // Tokens to compute before it samples, expected (from expected_start()).
    int32_t prefill_left() const { return static_cast<int32_t>(tokens.size()) - expected_start(); }
    // Prompt tokens its prefill computes: less what the cache held when it was first placed,
    // or, until then, what it is expected to hold.
    int32_t uncached_prompt() const;
    // When the next token is due (nanoseconds): the first by arrival + its tier's target, then
    // by its one-token-per-TPOT deadline, and at most longest_pause_ns() after its latest
    // token; INT64_MAX without a deadline.
    int64_t next_token_due() const;
  };
  struct planned {
    seq_id seq;
    int32_t positions;  // positions it holds after the step; equal to computed: kept, not stepped
    int32_t tokens;     // the tokens it computes (a new one: at most these, whatever the cache held)
  };
  std::vector<const sequence*> keep_order() const;
  // Its prompt alone, on an idle engine by `time`'s model, cannot meet its first-token target.
  bool infeasible(const sequence& s, const step_time_budget& time) const;
  // A started prompt (some of it computed) whose first token would come after its late line
  // (late_after_targets times its target after arrival) if it skipped this step: its rest goes
  // first in the step, ahead of the higher tiers' prompts, and it keeps its place in the step.
  bool prefill_at_stake(const sequence& s, const step_time_budget& time, int64_t now) const;
  // Seconds of decoding each step carries for a prompt of each priority: the running decodes of
  // that priority and above (they step beside its prefill), highest priority first.
  std::vector<std::pair<int32_t, double>> decode_seconds_above(const step_time_budget& time) const;
  // Seconds from starting an unstarted prompt now to its first token (take_late, wake_at).
  double first_token_after_start(const sequence& s, const step_time_budget& time,
                                 const std::vector<std::pair<int32_t, double>>& decodes) const;
  // Seconds of a step at the budget's pace that go to decodes: the first tier's, and a lower
  // tier's whose next token would be late if it yielded (as propose() places them).
  // tiers: placed[tiers[t]..tiers[t + 1]) share a priority.
  double paced_decode_seconds(const std::vector<const sequence*>& order, const std::vector<size_t>& placed,
                              const std::vector<size_t>& tiers, const step_time_budget& time, int64_t now) const;
  struct prefill_pick {
    size_t at;    // into order
    int64_t due;  // the first-token deadline a longer step may be taken for (INT64_MAX: none)
  };
  // The prefill candidates among order[placed[first..last)] (one tier), in the order the
  // step's prefill budget goes to them.
  std::vector<prefill_pick> prefill_order(const std::vector<const sequence*>& order, const std::vector<size_t>& placed,
                                          size_t first, size_t last, const step_time_budget& time, int64_t now) const;
  // This step's seconds: the budget's, or longer (see max_step_stretch) within the decodes' slack
  // when the first prompt in line (of the highest tier, in prefill order) that has a deadline
  // would miss it at the budget's pace; then from that prompt's tier on, prefill goes first:
  // the decodes of its tier and below whose next token is not due within two steps yield to
  // it. prefills: each tier's prefill_order().
  struct step_shape {
    double seconds = 0;
    size_t prefill_first = 0;  // the first tier whose prefill goes before its decodes (none: the number of tiers)
  };
  step_shape shape_step(const std::vector<const sequence*>& order, const std::vector<size_t>& placed,
                        const std::vector<std::vector<prefill_pick>>& prefills, const step_time_budget& time,
                        double decode_seconds, int64_t now) const;
  // The step propose() drafts: the sequences in keep order, their places in the step, and
  // the tokens each computes.
  struct draft {
    std::vector<const sequence*> order;                // keep_order()
    std::vector<size_t> placed;                        // indexes into order of the places in the step
    std::vector<size_t> tiers;                         // placed[tiers[t]..tiers[t + 1]) share a priority
    std::vector<std::vector<prefill_pick>> prefills;   // each tier's prefill_order()
    std::vector<int32_t> tokens;                       // what order[i] computes (0: not stepped)
  };
  // Prompt tokens a step at the budget's pace takes beside decode_seconds of decodes.
  double prefill_pace(const step_time_budget& time, double decode_seconds) const;
  // Whether the started prompts at stake (prefill_at_stake) may go first in this step: no
  // prompt in line (in prefill order) that would make its first-token deadline at the budget's
  // pace misses it with their rest ahead of it.
  bool stake_may_go_first(const draft& d, const step_time_budget& time, double decode_seconds, int64_t now) const;
  std::vector<size_t> places_in_step(const std::vector<const sequence*>& order, const step_time_budget& time,
                                     int64_t now) const;
  // The share of its remaining answer a running request is expected to write (see
  // kv_growth_quantile): a quantile of the last answers, so once per step (kv_room::ratio).
  double kv_growth_ratio() const;
  // Blocks the sequence is expected to hold by its end: its tokens, and `ratio` of the answer
  // it may still write (at most kv_growth_clip tokens of it).
  int32_t blocks_by_end(const sequence& s, double ratio) const;
  int32_t blocks_held(const sequence& s) const;
  // Whether a sequence that holds no blocks may start this step, after the starts before it
  // (need_before blocks): the pool's free blocks, with those the running requests of lower
  // tiers hold (a start of a higher tier takes them back), must still carry what the running
  // requests of its tier and above are expected to grow by (SGLang's new-token reservation:
  // a start never preempts a stream of its own tier or above later on).
  struct kv_room {
    std::map<int32_t, std::pair<int64_t, int64_t>> by_priority;  // growth, held blocks of the running
    double ratio = 1;    // kv_growth_ratio(), this step
    int64_t free = 0;    // the pool's free blocks
    bool known = false;  // the pool answered once: free is known
    bool idle = true;    // no request holds blocks
  };
  kv_room room_in_kv() const;
  bool may_start(const kv_room& room, const sequence& s, int64_t need_before) const;
  void fill_by_tokens(draft& d) const;
  void fill_by_time(draft& d, const step_time_budget& time, int64_t now) const;
  void plan_entries(const draft& d, kv_request& r);

  scheduler_limits limits_;
  std::map<seq_id, sequence> seqs_;
  std::vector<seq_id> releases_;
  std::vector<seq_id> forgotten_;
  std::vector<planned> plan_;
  std::vector<seq_id> batch_seqs_;  // the sequences of the step being run, in batch order
  step_batch batch_;
  std::vector<scheduler_event> pending_events_;  // preemptions seen in finalize
  std::vector<kv_commit> commits_;
  // One more each time a request ends (finished or cancelled: its blocks come back) or no
  // request holds any: a sequence refused in an earlier epoch is in line again.
  uint64_t release_epoch_ = 0;
  bool refused(const sequence& s) const { return s.refused_epoch == release_epoch_; }
  bool replan_ = false;  // see take_replan()
  // The pool's free blocks after the last step's grants, and those given back since (ends);
  // -1: no grant seen yet (no gate on starts).
  int64_t free_blocks_ = -1;
  int64_t freed_blocks_ = 0;
  // What the answers that ended wrote of what they could (max_tokens, kv_growth_clip at most),
  // and the bump of the last preemptions (see kv_growth_quantile).
  step_residuals answer_shares_{256, 32};
  double kv_growth_bump_ = 0;
};

}  // namespace tireless
