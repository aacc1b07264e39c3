#include "scheduler/batch_scheduler.hpp"

#include "scheduler/batch_detail.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>

namespace tireless {

void batch_scheduler::add(sequence_spec spec) {
  if (spec.prompt.empty()) throw std::invalid_argument("a sequence needs a prompt");
  if (seqs_.count(spec.id)) throw std::logic_error("sequence added twice");
  sequence s;
  s.tokens = spec.prompt;
  s.window = spec.token_window;
  s.spec = std::move(spec);
  seqs_.emplace(s.spec.id, std::move(s));
}

bool batch_scheduler::cancel(seq_id seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  if (it->second.running) {
    releases_.push_back(seq);
    freed_blocks_ += blocks_held(it->second);
  }
  if (it->second.shard_has > 0) forgotten_.push_back(seq);
  seqs_.erase(it);
  return true;
}

std::vector<seq_id> batch_scheduler::take_late(int64_t now, const step_time_budget& time) {
  std::vector<seq_id> late;
  const auto decodes = decode_seconds_above(time);
  for (const auto& [id, s] : seqs_) {
    if (s.running || s.generated > 0 || s.preemptions > 0 || s.spec.start_by <= 0) continue;
    const double prefill = first_token_after_start(s, time, decodes);
    if (static_cast<double>(now) + prefill * 1e9 > static_cast<double>(s.spec.start_by)) late.push_back(id);
  }
  for (seq_id id : late) seqs_.erase(id);
  return late;
}

void batch_scheduler::acknowledge(seq_id seq, int32_t tokens) {
  if (auto it = seqs_.find(seq); it != seqs_.end()) it->second.window += tokens;
}

std::vector<const batch_scheduler::sequence*> batch_scheduler::keep_order() const {
  // Sorted by a key computed once per sequence: unpaused first, higher priority, running
  // before waiting, older first.
  struct keyed {
    bool paused;
    int32_t priority;
    bool running;
    uint64_t arrival;
    seq_id id;
    const sequence* s;
  };
  std::vector<keyed> keys;
  keys.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) keys.push_back({s.paused(), s.spec.priority, s.running, s.spec.arrival, id, &s});
  std::sort(keys.begin(), keys.end(), [](const keyed& x, const keyed& y) {
    if (x.paused != y.paused) return !x.paused;
    if (x.priority != y.priority) return x.priority > y.priority;
    if (x.running != y.running) return x.running;
    if (x.arrival != y.arrival) return x.arrival < y.arrival;
    return x.id < y.id;
  });
  std::vector<const sequence*> order;
  order.reserve(keys.size());
  for (const keyed& k : keys) order.push_back(k.s);
  return order;
}

using batch_detail::is_decode;
using batch_detail::no_deadline;

double idle_prefill_seconds(int32_t prompt_tokens, const step_time_budget& time, int32_t max_step_tokens) {
  const double chunk = std::max(max_step_tokens, 1);
  return prompt_tokens * time.per_prefill_token + std::ceil(prompt_tokens / chunk) * time.c0;
}

int64_t longest_pause_ns(const sequence_spec& spec) {
  return std::max(static_cast<int64_t>(max_step_stretch * static_cast<double>(spec.tpot_target_ns)), spec.ttft_target_ns);
}

int64_t batch_scheduler::sequence::next_token_due() const {
  if (generated == 0) return spec.ttft_target_ns > 0 ? static_cast<int64_t>(spec.arrival) + spec.ttft_target_ns : no_deadline;
  if (spec.tpot_target_ns <= 0 || first_token_at < 0) return no_deadline;
  // One token per TPOT on average, and never a pause longer than longest_pause_ns(), however
  // far ahead the stream ran (its slack is not spent on one long stall).
  return std::min(first_token_at + static_cast<int64_t>(generated) * spec.tpot_target_ns,
                  last_token_at + longest_pause_ns(spec));
}

bool batch_scheduler::infeasible(seq_id seq, const step_time_budget& time) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && infeasible(it->second, time);
}

int32_t batch_scheduler::sequence::expected_start() const {
  if (running) return computed;
  return std::max(computed, std::min(spec.expected_cached, static_cast<int32_t>(tokens.size()) - 1));
}

int32_t batch_scheduler::sequence::uncached_prompt() const {
  const auto prompt = static_cast<int32_t>(spec.prompt.size());
  return prompt - (placed_cached >= 0 ? placed_cached : std::clamp(spec.expected_cached, 0, std::max(prompt - 1, 0)));
}

// Judged by what its prefill computes: a prompt whose long prefix is cached (an agent's system
// prompt) is not infeasible for its length.
bool batch_scheduler::infeasible(const sequence& s, const step_time_budget& time) const {
  return s.generated == 0 && s.spec.ttft_target_ns > 0 && time.per_prefill_token > 0 &&
         idle_prefill_seconds(s.uncached_prompt(), time, limits_.max_step_tokens) >
             static_cast<double>(s.spec.ttft_target_ns) * 1e-9;
}

std::vector<std::pair<int32_t, double>> batch_scheduler::decode_seconds_above(const step_time_budget& time) const {
  std::map<int32_t, double, std::greater<>> by_priority;
  for (const auto& [id, s] : seqs_) {
    if (s.running && is_decode(s) && !s.paused()) {
      by_priority[s.spec.priority] += time.per_decode + time.per_context_position * s.computed;
    }
  }
  std::vector<std::pair<int32_t, double>> above(by_priority.begin(), by_priority.end());
  for (size_t k = 1; k < above.size(); ++k) above[k].second += above[k - 1].second;
  return above;
}

// A prompt started now takes, each step, what the step's budget leaves beside the decodes of
// its tier and above (at least min_step_prefill_tokens, at most a max_step_tokens chunk); a
// step stretched for it (when those decodes have the slack) is as fast as an idle engine, so
// it takes the longer of the two. The higher tiers' prompts that arrive meanwhile are not
// counted: admission keeps its tier's start bound within its forecast of them.
double batch_scheduler::first_token_after_start(const sequence& s, const step_time_budget& time,
                                                const std::vector<std::pair<int32_t, double>>& decodes) const {
  const int32_t tokens = s.prefill_left();
  const double idle = idle_prefill_seconds(tokens, time, limits_.max_step_tokens);
  if (time.seconds <= 0 || time.per_prefill_token <= 0 || tokens <= 0) return idle;
  double beside = 0;  // the decodes of its priority and above
  for (const auto& [priority, seconds] : decodes) {
    if (priority < s.spec.priority) break;
    beside = seconds;
  }
  const double room = std::max(time.seconds - time.c0 - beside, min_step_prefill_tokens * time.per_prefill_token);
  const double per_step = std::min(room / time.per_prefill_token, static_cast<double>(std::max(limits_.max_step_tokens, 1)));
  const double steps = std::ceil(tokens / per_step);
  const double paced = steps * (time.c0 + beside) + tokens * time.per_prefill_token;
  return std::max(idle, paced);
}

step_batch batch_scheduler::finalize(const kv_reply& reply) {
  assert(reply.grants.size() == plan_.size());
  replan_ = replan_ || !reply.preempted.empty();
  free_blocks_ = reply.stats.free;
  freed_blocks_ = 0;
  kv_growth_bump_ = reply.preempted.empty() ? std::max(0.0, kv_growth_bump_ - kv_growth_bump_decay)
                                            : std::min(1.0, kv_growth_bump_ + kv_growth_bump);
  for (seq_id p : reply.preempted) {
    auto it = seqs_.find(p);
    if (it == seqs_.end()) continue;
    sequence& s = it->second;
    s.running = false;
    s.computed = 0;
    s.held_positions = 0;
    s.committed_blocks = 0;
    s.table.clear();
    if (s.shard_has > 0) forgotten_.push_back(p);
    s.shard_has = 0;
    s.shard_history = 0;
    ++s.preemptions;
    s.refused_epoch = release_epoch_;
    pending_events_.push_back({scheduler_event::kind::preempted, p, {}, {}});
  }
  batch_.seqs.clear();
  batch_seqs_.clear();
  for (size_t i = 0; i < plan_.size(); ++i) {
    const kv_grant& g = reply.grants[i];
    auto it = seqs_.find(plan_[i].seq);
    if (!g.granted) {
      if (it != seqs_.end() && !it->second.running && !refused(it->second)) {
        it->second.refused_epoch = release_epoch_;
        replan_ = true;
      }
      continue;
    }
    if (it == seqs_.end()) {  // cancelled while the KV request was out: give the blocks back
      if (std::find(releases_.begin(), releases_.end(), plan_[i].seq) == releases_.end()) releases_.push_back(plan_[i].seq);
      continue;
    }
    sequence& s = it->second;
    if (!s.running) {
      s.running = true;
      s.computed = g.cached_tokens;
      s.cached_tokens += g.cached_tokens;
      if (s.placed_cached < 0) s.placed_cached = std::min(g.cached_tokens, static_cast<int32_t>(s.spec.prompt.size()));
    }
    s.held_positions = std::max(s.held_positions, plan_[i].positions);
    assert(g.table_from <= static_cast<int32_t>(s.table.size()));
    s.table.resize(static_cast<size_t>(g.table_from));
    s.table.insert(s.table.end(), g.table.begin(), g.table.end());
    s.shard_has = std::min(s.shard_has, g.table_from);
    // A new sequence that found less cached than expected computes no more than was planned.
    const int32_t end = std::min({static_cast<int32_t>(s.tokens.size()),
                                  static_cast<int32_t>(s.table.size()) * limits_.block_size, plan_[i].positions,
                                  s.computed + plan_[i].tokens});
    const int32_t n = end - s.computed;
    if (n <= 0) continue;
    sequence_step st;
    st.seq_id = s.spec.id;
    st.tokens = std::span<const token_id>(s.tokens.data() + s.computed, static_cast<size_t>(n));
    st.start_pos = s.computed;
    st.block_table = s.table;
    st.table_from = std::min(s.shard_has, static_cast<int32_t>(s.table.size()));
    s.shard_has = static_cast<int32_t>(s.table.size());
    st.sample = s.computed + n == static_cast<int32_t>(s.tokens.size());
    st.sampling = s.spec.sampling;
    if (st.sampling.penalized()) {
      st.history = std::span<const token_id>(s.tokens.data(), static_cast<size_t>(s.computed + n));
      st.prompt_len = static_cast<int32_t>(s.tokens.size()) - s.generated;
      st.history_from = std::min(s.shard_history, s.computed);
      s.shard_history = s.computed + n;
    }
    batch_.seqs.push_back(st);
    batch_seqs_.push_back(s.spec.id);
  }
  return batch_;
}

std::vector<scheduler_event> batch_scheduler::commit(const step_result& result, int64_t now) {
  std::vector<scheduler_event> events = std::move(pending_events_);
  pending_events_.clear();
  for (size_t i = 0; i < batch_seqs_.size(); ++i) {
    auto it = seqs_.find(batch_seqs_[i]);
    if (it == seqs_.end()) continue;  // cancelled while the step ran
    sequence& s = it->second;
    const sequence_step& st = batch_.seqs[i];
    s.computed = st.start_pos + static_cast<int32_t>(st.tokens.size());
    if (st.sample) {
      const token_id t = result.next[i];
      s.tokens.push_back(t);
      if (s.generated++ == 0) s.first_token_at = now;
      s.last_token_at = now;
      if (s.spec.token_window > 0) --s.window;
      events.push_back({scheduler_event::kind::tokens, s.spec.id, {t}, {}});
      if (s.spec.sampling.logprobs >= 0 && i < result.logprobs.size()) events.back().logprobs.push_back(result.logprobs[i]);
      std::optional<finish_reason> done;
      if (std::find(s.spec.stop_tokens.begin(), s.spec.stop_tokens.end(), t) != s.spec.stop_tokens.end()) {
        done = finish_reason::stop_token;
      } else if (s.generated >= s.spec.max_tokens) {
        done = finish_reason::max_tokens;
      } else if (static_cast<int32_t>(s.tokens.size()) >= limits_.max_context) {
        done = finish_reason::context_full;
      }
      if (done) {
        scheduler_event e{scheduler_event::kind::finished, s.spec.id, {}, *done};
        e.prompt_tokens = static_cast<int32_t>(s.spec.prompt.size());
        e.generated = s.generated;
        e.cached_tokens = s.cached_tokens;
        e.preemptions = s.preemptions;
        events.push_back(std::move(e));
        releases_.push_back(s.spec.id);
        freed_blocks_ += blocks_held(s);
        answer_shares_.add(std::clamp(s.spec.max_tokens, 1, kv_growth_clip), std::min(s.generated, kv_growth_clip));
        forgotten_.push_back(s.spec.id);
        seqs_.erase(it);
        continue;
      }
    }
    const int32_t full = s.computed / limits_.block_size;
    if (full > s.committed_blocks) {
      const auto from = s.tokens.begin() + static_cast<ptrdiff_t>(s.committed_blocks) * limits_.block_size;
      commits_.push_back({s.spec.id, std::vector<token_id>(from, s.tokens.begin() + s.computed), s.computed,
                          s.committed_blocks});
      s.committed_blocks = full;
    }
  }
  batch_seqs_.clear();
  batch_.seqs.clear();
  return events;
}

bool batch_scheduler::has_work() const {
  if (!releases_.empty() || !commits_.empty()) return true;
  for (const auto& [id, s] : seqs_) {
    if (!s.paused()) return true;
  }
  return false;
}

std::optional<int64_t> batch_scheduler::wake_at(int64_t now, const step_time_budget& time) const {
  int64_t at = no_deadline;
  const auto two_steps = static_cast<int64_t>(2e9 * time.seconds);
  const auto decodes = decode_seconds_above(time);
  for (const auto& [id, s] : seqs_) {
    if (s.running && is_decode(s) && !s.paused()) {
      const int64_t due = s.next_token_due();
      if (due != no_deadline) at = std::min(at, due - two_steps);
    } else if (!s.running && s.generated == 0 && s.preemptions == 0 && s.spec.start_by > 0) {
      const double prefill = first_token_after_start(s, time, decodes);
      at = std::min(at, s.spec.start_by - static_cast<int64_t>(prefill * 1e9) + 1);
    }
  }
  if (at == no_deadline) return std::nullopt;
  return std::max(at, now + std::max<int64_t>(static_cast<int64_t>(time.seconds * 1e9), 1'000'000));
}

sequence_counts batch_scheduler::counts(const step_time_budget& time) const {
  sequence_counts c;
  std::map<int32_t, tier_load, std::greater<>> tiers;
  for (const auto& [id, s] : seqs_) {
    tier_load& t = tiers[s.spec.priority];
    t.priority = s.spec.priority;
    t.tpot_seconds = std::max(t.tpot_seconds, static_cast<double>(s.spec.tpot_target_ns) * 1e-9);
    if (s.paused()) ++c.paused;
    if (s.running) {
      ++c.running;
      ++t.running;
      c.running_context += s.computed;
    } else {
      ++c.waiting;
      ++t.waiting;
    }
    const int64_t left = s.prefill_left();
    if (is_decode(s)) {
      ++t.decodes;
      t.context += static_cast<double>(s.computed);
    } else if (!limits_.least_slack && infeasible(s, time)) {
      t.later_tokens += left;
    } else {
      t.prompt_tokens += left;
    }
  }
  for (auto& [priority, t] : tiers) c.tiers.push_back(t);
  return c;
}

int32_t batch_scheduler::preemptions(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.preemptions;
}

int32_t batch_scheduler::cached_tokens(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.cached_tokens;
}

int32_t batch_scheduler::tokens_of(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.tokens.size());
}

}  // namespace tireless
