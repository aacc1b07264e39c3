// How propose() composes a step: the places in it, each tier's prefill order, the step's
// length, the tokens each sequence computes (by tokens, or by the time budget), and what the
// step holds in the KV pool. batch_scheduler.cpp keeps the sequences' lifecycle.

#include <algorithm>
#include <cmath>
#include <limits>

#include "scheduler/batch_detail.hpp"
#include "scheduler/batch_scheduler.hpp"

namespace tireless {

using batch_detail::is_decode;
using batch_detail::no_deadline;

bool batch_scheduler::prefill_at_stake(const sequence& s, const step_time_budget& time, int64_t now) const {
  if (s.generated > 0 || s.computed == 0 || s.spec.ttft_target_ns <= 0 || time.seconds <= 0 || infeasible(s, time)) {
    return false;
  }
  const double line = static_cast<double>(s.spec.arrival) + late_after_targets * static_cast<double>(s.spec.ttft_target_ns);
  const double left = s.prefill_left() * time.per_prefill_token;
  return static_cast<double>(now) + (2 * time.seconds + left) * 1e9 >= line;
}

double batch_scheduler::paced_decode_seconds(const std::vector<const sequence*>& order, const std::vector<size_t>& placed,
                                             const std::vector<size_t>& tiers, const step_time_budget& time,
                                             int64_t now) const {
  double seconds = 0;
  const int64_t skip_is_late = now + static_cast<int64_t>(2e9 * time.seconds);
  for (size_t k = 0; k < placed.size(); ++k) {
    const sequence& s = *order[placed[k]];
    if (is_decode(s) && (k < tiers[1] || s.next_token_due() <= skip_is_late)) {
      seconds += time.per_decode + time.per_context_position * s.computed;
    }
  }
  return seconds;
}

std::vector<batch_scheduler::prefill_pick> batch_scheduler::prefill_order(const std::vector<const sequence*>& order,
                                                                          const std::vector<size_t>& placed, size_t first,
                                                                          size_t last, const step_time_budget& time,
                                                                          int64_t now) const {
  // Earliest deadline first, late ones first (admission keeps a sheddable tier's load within
  // what its deadlines allow, and refuses what waited too long). Then prompts without a
  // deadline, then the infeasible ones: those whose whole prefill on an idle engine takes
  // longer than their first-token target (they cannot meet it whatever the order; serving
  // them first would make the others miss too), oldest first. Least slack (the deadline less
  // the prompt's own prefill) was measured worse: a prompt part-prefilled gains slack and is
  // paused for newer ones, so more of them are late (h200-k2-fleet at 3x: premium 99.2% ->
  // 98.7%); so was an infeasible prompt's own deadline (1.5 or 1.75 times its idle prefill,
  // by EDF or once it was at stake): it took the prefill from the feasible prompts of its tier
  // that arrived meanwhile (h200-ramp short form at 1x: premium 98.3% -> 95.2%).
  // In a tier that is not sheddable (no start_by), a prompt already past its first-token
  // deadline goes by its late line (late_after_targets times its target after arrival) while
  // it can still make that, then after the others: the tier alone is over the capacity, and
  // serving the late first would make every one of them late.
  struct candidate {
    int rank;        // 0: by a deadline, 1: no deadline, 2: past its late line (not sheddable), 3: infeasible
    int64_t due;     // ranks 0 and 2: the order within the rank
    size_t at;       // keep order
    double seconds = 0;     // rank 0: its remaining prefill on an idle engine
    bool started = false;   // rank 0: some of it was computed (never deferred)
  };
  std::vector<candidate> c;
  for (size_t k = first; k < last; ++k) {
    const sequence& s = *order[placed[k]];
    if (is_decode(s)) continue;
    const int64_t due = s.next_token_due();
    const double seconds = idle_prefill_seconds(s.prefill_left(), time, limits_.max_step_tokens);
    if (due == no_deadline) {
      c.push_back({1, 0, k});
    } else if (limits_.least_slack) {
      c.push_back({0, due - static_cast<int64_t>(seconds * 1e9), k});
    } else if (infeasible(s, time)) {
      c.push_back({3, 0, k});
    } else if (s.generated == 0 && s.computed == 0 && s.spec.start_by == 0 && due < now) {
      // Past its target, unstarted, in a tier that is never refused after admission: by its
      // late line while it can still make that, then after the others.
      const int64_t line = static_cast<int64_t>(s.spec.arrival) + static_cast<int64_t>(late_after_targets * static_cast<double>(s.spec.ttft_target_ns));
      if (now < line) {
        c.push_back({0, line, k, seconds});
      } else {
        c.push_back({2, due, k});
      }
    } else {
      c.push_back({0, due, k, seconds, s.computed > 0 || s.generated > 0});
    }
  }
  std::sort(c.begin(), c.end(), [](const candidate& x, const candidate& y) {
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.due != y.due) return x.due < y.due;
    return x.at < y.at;
  });
  if (limits_.most_on_time && !limits_.least_slack && time.per_prefill_token > 0) {
    // The most prompts that can meet their deadlines together (Moore-Hodgson): in deadline
    // order, when the next one would be late even at the idle prefill rate, the longest of
    // those not yet started goes after the others (a burst of a tier's own prompts that is
    // feasible one by one, not together: the longest waits, the rest are on time). A
    // sheddable prompt deferred past its start bound is refused unstarted (take_late).
    const size_t n0 = static_cast<size_t>(std::count_if(c.begin(), c.end(), [](const candidate& x) { return x.rank == 0; }));
    std::vector<bool> deferred(n0, false);
    double t = static_cast<double>(now) * 1e-9;
    for (size_t j = 0; j < n0; ++j) {
      t += c[j].seconds;
      if (t <= static_cast<double>(c[j].due) * 1e-9) continue;
      size_t longest = n0;
      for (size_t i = 0; i <= j; ++i) {
        if (deferred[i] || c[i].started) continue;
        if (longest == n0 || c[i].seconds > c[longest].seconds) longest = i;
      }
      if (longest == n0) continue;
      deferred[longest] = true;
      t -= c[longest].seconds;
    }
    std::vector<candidate> on_time, later;
    for (size_t i = 0; i < n0; ++i) (deferred[i] ? later : on_time).push_back(c[i]);
    std::copy(later.begin(), later.end(), std::copy(on_time.begin(), on_time.end(), c.begin()));
  }
  std::vector<prefill_pick> out;
  out.reserve(c.size());
  for (const candidate& x : c) {
    // A longer step is taken for a deadline: none for an infeasible prompt (it waits behind
    // the others) or one without.
    out.push_back({placed[x.at], x.rank == 0 || x.rank == 2 ? x.due : no_deadline});
  }
  return out;
}

double batch_scheduler::prefill_pace(const step_time_budget& time, double decode_seconds) const {
  return std::clamp((time.seconds - time.c0 - decode_seconds) / time.per_prefill_token,
                    static_cast<double>(min_step_prefill_tokens), static_cast<double>(limits_.max_step_tokens));
}

bool batch_scheduler::stake_may_go_first(const draft& d, const step_time_budget& time, double decode_seconds,
                                         int64_t now) const {
  if (time.per_prefill_token <= 0) return false;
  double stake = 0;
  for (const std::vector<prefill_pick>& tier : d.prefills) {
    for (const prefill_pick& p : tier) {
      const sequence& s = *d.order[p.at];
      if (prefill_at_stake(s, time, now)) stake += s.prefill_left();
    }
  }
  if (stake == 0) return false;
  const double pace = prefill_pace(time, decode_seconds);
  auto done_at = [&](double tokens) { return static_cast<double>(now) + std::ceil(tokens / pace) * time.seconds * 1e9; };
  double ahead = 0;  // prompt tokens in line up to this one (its own included)
  for (const std::vector<prefill_pick>& tier : d.prefills) {
    for (const prefill_pick& p : tier) {
      const sequence& s = *d.order[p.at];
      if (prefill_at_stake(s, time, now)) continue;
      ahead += s.prefill_left();
      if (s.generated > 0 || s.spec.ttft_target_ns <= 0) continue;
      // An infeasible prompt (no deadline to make) by its own late line: twice its idle prefill.
      const double due = p.due != no_deadline ? static_cast<double>(p.due)
                                              : static_cast<double>(s.spec.arrival) +
                                                    late_after_targets * 1e9 *
                                                        idle_prefill_seconds(s.uncached_prompt(), time,
                                                                             limits_.max_step_tokens);
      // A step to spare: the pace is the budget's, and steps run longer or shorter.
      if (done_at(ahead) <= due && done_at(ahead + stake) + time.seconds * 1e9 > due) return false;
    }
  }
  return true;
}

batch_scheduler::step_shape batch_scheduler::shape_step(const std::vector<const sequence*>& order,
                                                        const std::vector<size_t>& placed,
                                                        const std::vector<std::vector<prefill_pick>>& prefills,
                                                        const step_time_budget& time, double decode_seconds,
                                                        int64_t now) const {
  const size_t none = prefills.size();
  if (time.per_prefill_token <= 0 || placed.empty()) return {time.seconds, none};
  // The least slack of all decodes bounds a longer step (those with more slack than two steps
  // at the budget's pace yield in it). decode_seconds: the decodes that run at that pace.
  int64_t decode_slack = no_deadline;
  double all_decode_seconds = 0;  // every decode of the step, should none of them yield
  std::vector<bool> in_step(order.size(), false);
  for (size_t k : placed) {
    in_step[k] = true;
    const sequence& s = *order[k];
    if (!is_decode(s)) continue;
    decode_slack = std::min(decode_slack, s.next_token_due() - now);
    all_decode_seconds += time.per_decode + time.per_context_position * s.computed;
  }
  // A stream left out of the step (it yields) has its token a step after this one at the
  // earliest: a longer step leaves it less (random machine seed 12: a free stream 28 ms past
  // its 6-s bound behind a step stretched for a premium prompt).
  const auto next_step = static_cast<int64_t>(time.seconds * 1e9);
  for (size_t k = 0; k < order.size(); ++k) {
    const sequence& s = *order[k];
    if (!in_step[k] && is_decode(s) && !s.paused()) decode_slack = std::min(decode_slack, s.next_token_due() - now - next_step);
  }
  if (decode_slack <= 0) return {time.seconds, none};
  // The prompts in line for prefill, the highest tier's first, each in its prefill order:
  // the first with a deadline that it would miss at the budget's pace, with the work ahead of
  // it, asks for a longer step, and its tier's prefill goes first.
  const double pace = prefill_pace(time, decode_seconds);
  // A step that takes prompt tokens up to `tokens` in line (a chunk at most, beside every
  // decode, a token to spare for rounding).
  auto step_through = [&](double tokens) {
    return time.c0 + all_decode_seconds +
           time.per_prefill_token * (std::min(tokens, static_cast<double>(limits_.max_step_tokens)) + 1);
  };
  struct earlier_prompt {
    double through;  // prompt tokens in line up to its last
    int64_t due;
  };
  std::vector<earlier_prompt> earlier;
  double ahead = 0;  // prompt tokens in line before it
  for (size_t t = 0; t < prefills.size(); ++t) {
    for (const prefill_pick& p : prefills[t]) {
      const sequence& s = *order[p.at];
      ahead += s.prefill_left();
      if (s.generated > 0 || p.due == no_deadline) continue;
      const double steps = std::ceil(ahead / pace);
      if (static_cast<double>(now) + steps * time.seconds * 1e9 <= static_cast<double>(p.due)) {
        earlier.push_back({ahead, p.due});
        continue;
      }
      // As long as the prompts in line up to this one take in one step, and no longer than
      // the decodes can wait: nothing of the prompt is left for a step after, and no lower
      // tier's prefill fills a longer step that the prompt's first token would wait for.
      const double headroom = std::min(time.headroom, time.stretch_headroom);
      const double wait = decode_slack == no_deadline ? std::numeric_limits<double>::infinity() : static_cast<double>(decode_slack) * 1e-9 * headroom;
      double seconds = std::min(step_through(ahead), wait);
      // But a prompt ahead in line that this step would make miss its deadline, and one
      // ending with it would not: the step ends with it (the rest goes on in the next).
      for (const earlier_prompt& e : earlier) {
        const double by = static_cast<double>(e.due - now) * 1e-9 * headroom;
        if (seconds > by && step_through(e.through) <= by) {
          seconds = step_through(e.through);
          break;
        }
      }
      return {std::max(time.seconds, seconds), t};
    }
  }
  return {time.seconds, none};
}

kv_request batch_scheduler::propose(const step_time_budget& time, int64_t now) {
  const bool any_running = std::any_of(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.running; });
  if (!releases_.empty() || !any_running) ++release_epoch_;
  replan_ = false;
  kv_request r;
  r.releases = std::exchange(releases_, {});
  r.commits = std::exchange(commits_, {});
  draft d;
  d.order = keep_order();
  d.placed = places_in_step(d.order, time, now);
  for (size_t k = 0; k < d.placed.size(); ++k) {
    if (k == 0 || d.order[d.placed[k]]->spec.priority != d.order[d.placed[k - 1]]->spec.priority) d.tiers.push_back(k);
  }
  d.tiers.push_back(d.placed.size());
  for (size_t t = 0; t + 1 < d.tiers.size(); ++t) {
    d.prefills.push_back(prefill_order(d.order, d.placed, d.tiers[t], d.tiers[t + 1], time, now));
  }
  d.tokens.assign(d.order.size(), 0);
  if (time.seconds <= 0) {
    fill_by_tokens(d);
  } else {
    fill_by_time(d, time, now);
  }
  plan_entries(d, r);
  return r;
}

// Places in the step go in keep order (higher tiers first, so a full batch of low-tier
// decodes cannot keep a premium request out: vLLM issue 40004), except those a running
// stream further down needs: one whose next token would be late if it skipped this step
// keeps a place, so a queue of higher-tier prompts longer than the step's tokens reach
// (places they get nothing in) cannot stall it for as long as they wait.
std::vector<size_t> batch_scheduler::places_in_step(const std::vector<const sequence*>& order,
                                                    const step_time_budget& time, int64_t now) const {
  const int64_t skip_is_late_at = now + static_cast<int64_t>(2e9 * std::max(time.seconds, 0.0));
  auto steps = [&](const sequence& s) {
    return !s.paused() && !refused(s) && static_cast<int32_t>(s.tokens.size()) > s.computed;
  };
  const kv_room room = room_in_kv();
  int64_t starting = 0;  // blocks the starts placed so far are expected to hold by their end
  auto must_run = [&](const sequence& s) {
    return is_decode(s) ? s.next_token_due() <= skip_is_late_at : prefill_at_stake(s, time, now);
  };
  const auto places = static_cast<size_t>(std::max(limits_.max_step_seqs, 0));
  size_t kept = 0;  // places kept for the streams further down that must run
  for (const sequence* s : order) kept += steps(*s) && must_run(*s);
  std::vector<size_t> placed;
  placed.reserve(order.size());
  for (size_t i = 0; i < order.size() && placed.size() < places; ++i) {
    const sequence& s = *order[i];
    if (!steps(s)) continue;
    if (!s.running) {
      if (!may_start(room, s, starting)) continue;
      starting += blocks_by_end(s, room.ratio);
    }
    if (must_run(s)) {
      --kept;
    } else if (placed.size() + kept >= places) {
      continue;
    }
    placed.push_back(i);
  }
  return placed;
}

int32_t batch_scheduler::blocks_held(const sequence& s) const {
  const int32_t bs = std::max(limits_.block_size, 1);
  return (s.held_positions + bs - 1) / bs;
}

int32_t batch_scheduler::blocks_by_end(const sequence& s, double ratio) const {
  const int32_t bs = std::max(limits_.block_size, 1);
  const int32_t answer_left = std::clamp(s.spec.max_tokens - s.generated, 0, kv_growth_clip);
  const double positions = static_cast<double>(s.tokens.size()) + ratio * answer_left;
  return static_cast<int32_t>(std::ceil(std::min(positions, static_cast<double>(limits_.max_context)) / bs));
}

double batch_scheduler::kv_growth_ratio() const {
  return std::min(1.0, std::max(kv_growth_ratio_min, answer_shares_.quantile(kv_growth_quantile)) + kv_growth_bump_);
}

batch_scheduler::kv_room batch_scheduler::room_in_kv() const {
  kv_room room;
  room.known = free_blocks_ >= 0;
  room.ratio = kv_growth_ratio();
  room.free = free_blocks_ + freed_blocks_;
  for (const auto& [id, s] : seqs_) {
    if (!s.running) continue;
    room.idle = false;
    auto& [growth, held] = room.by_priority[s.spec.priority];
    const int32_t h = blocks_held(s);
    growth += std::max(0, blocks_by_end(s, room.ratio) - h);
    held += h;
  }
  return room;
}

bool batch_scheduler::may_start(const kv_room& room, const sequence& s, int64_t need_before) const {
  // Before the pool's first answer, whatever it holds starts; an idle engine starts its first
  // request whatever it needs (the pool defers one it cannot hold now), and the starts beside
  // it wait for room as any other.
  if (!room.known || (room.idle && need_before == 0)) return true;
  int64_t left = room.free - need_before;
  for (const auto& [priority, blocks] : room.by_priority) {
    left += priority < s.spec.priority ? blocks.second : -blocks.first;
  }
  return blocks_by_end(s, room.ratio) <= left;
}

// Only tokens limit the step: one token for every decode first, then prefill chunks tier by
// tier, so decodes never starve behind a prefill the KV pool may refuse.
void batch_scheduler::fill_by_tokens(draft& d) const {
  int32_t budget = limits_.max_step_tokens;
  for (size_t i : d.placed) {
    if (is_decode(*d.order[i]) && budget > 0) {
      d.tokens[i] = 1;
      --budget;
    }
  }
  for (const std::vector<prefill_pick>& tier : d.prefills) {
    for (const prefill_pick& p : tier) {
      if (budget <= 0) break;
      const sequence& s = *d.order[p.at];
      const int32_t n = std::min(s.prefill_left(), budget);
      d.tokens[p.at] = n;
      budget -= n;
    }
  }
}

// The step time is the budget (the tightest tier's time per output token): work goes tier by
// tier, each tier's decodes before its prefill, so a premium prompt is prefilled before a free
// request's next token; what does not fit waits for the next step. A lower tier's decode yields
// so only within its own slack: one whose next token would be late if it skipped this step
// runs first. Two floors hold whatever the budget (a machine slower than the target, a
// sanitizer build): every decode of the first tier runs (skipping one only makes that tier's
// time per token worse), and prefill advances by min_step_prefill_tokens, the progress
// admission's predictions count on (so a waiting request is never starved by running decodes
// that fill the step's time).
void batch_scheduler::fill_by_time(draft& d, const step_time_budget& time, int64_t now) const {
  const std::vector<const sequence*>& order = d.order;
  const std::vector<size_t>& placed = d.placed;
  const std::vector<size_t>& tiers = d.tiers;
  std::vector<int32_t>& tokens = d.tokens;
  const double decode_seconds = paced_decode_seconds(order, placed, tiers, time, now);
  const step_shape shape = shape_step(order, placed, d.prefills, time, decode_seconds, now);
  const double seconds = shape.seconds;
  int32_t budget = limits_.max_step_tokens;
  double left = seconds - time.c0;
  int32_t prefill_floor = min_step_prefill_tokens;
  auto decode_cost = [&](const sequence& s) { return time.per_decode + time.per_context_position * s.computed; };
  auto place_decode = [&](size_t i) {
    tokens[i] = 1;
    --budget;
    left -= decode_cost(*order[i]);
  };
  // Decodes whose next token would be late if they skipped this step run first: a lower
  // tier's always; when a tier's prefill goes first, that tier's too, and then those without
  // a deadline as well (no slack of theirs is known to spend).
  const size_t n_tiers = tiers.size() - 1;
  const int64_t skip_is_late = now + static_cast<int64_t>(2e9 * seconds);
  for (size_t k = shape.prefill_first == 0 || n_tiers == 0 ? 0 : tiers[1]; k < placed.size(); ++k) {
    const sequence& s = *order[placed[k]];
    if (!is_decode(s) || budget <= 0) continue;
    const int64_t due = s.next_token_due();
    const bool yields = k >= tiers[std::min(shape.prefill_first, n_tiers)];
    if (due <= skip_is_late || (yields && due == no_deadline)) place_decode(placed[k]);
  }
  auto place_prefill = [&](size_t i) {
    const sequence& s = *order[i];
    // In doubles first: a fit that reads prefill as nearly free (step_time_model.hpp) makes the
    // quotient far outside an int32.
    const double room = time.per_prefill_token > 0 ? left / time.per_prefill_token : static_cast<double>(budget);
    const auto fit = static_cast<int32_t>(std::clamp(room, 0.0, static_cast<double>(budget)));
    const int32_t n = std::min({s.prefill_left() - tokens[i], budget,
                                std::max(fit, prefill_floor)});
    if (n <= 0) return;
    tokens[i] += n;
    budget -= n;
    left -= n * time.per_prefill_token;
    prefill_floor = std::max(prefill_floor - n, 0);
  };
  // Started prompts whose first token would otherwise be late (prefill_at_stake) go first,
  // whatever their tier (their prefill was spent, and their tier promised the late line), when
  // no prompt in line that would make its first-token deadline misses it behind them.
  if (stake_may_go_first(d, time, decode_seconds, now)) {
    for (const std::vector<prefill_pick>& tier : d.prefills) {
      for (const prefill_pick& p : tier) {
        if (budget > 0 && prefill_at_stake(*order[p.at], time, now)) place_prefill(p.at);
      }
    }
  }
  auto place_decodes = [&](size_t t) {
    for (size_t k = tiers[t]; k < tiers[t + 1]; ++k) {
      const sequence& s = *order[placed[k]];
      if (!is_decode(s) || tokens[placed[k]] > 0 || budget <= 0) continue;
      if (decode_cost(s) > left && (t > 0 || shape.prefill_first == 0)) continue;
      place_decode(placed[k]);
    }
  };
  for (size_t t = 0; t < n_tiers; ++t) {
    if (t < shape.prefill_first) place_decodes(t);
    for (const prefill_pick& p : d.prefills[t]) {
      if (budget <= 0) break;
      place_prefill(p.at);
    }
  }
  // A prompt would miss its first-token deadline at the budget's pace: the decodes of its
  // tier and below that are ahead of theirs (by two steps or more) yielded to prefill; they
  // take what time is left.
  for (size_t t = shape.prefill_first; t < n_tiers; ++t) place_decodes(t);
}

// What the step holds in the KV pool: every running sequence (stepped or kept) and the
// waiting ones it steps, in keep order; plan_ remembers it for finalize().
void batch_scheduler::plan_entries(const draft& d, kv_request& r) {
  plan_.clear();
  r.entries.reserve(d.order.size());
  plan_.reserve(d.order.size());
  for (size_t i = 0; i < d.order.size(); ++i) {
    const sequence& s = *d.order[i];
    const int32_t n = d.tokens[i];
    if (!s.running && n == 0) continue;  // waiting and not this step: nothing to hold
    kv_entry e;
    e.seq = s.spec.id;
    e.admit = !s.running;
    // A new sequence holds what the cache is expected to hold and its chunk; a running one
    // never less than it was granted (more, when the cache held less than expected).
    e.positions = s.running ? std::max(s.computed + n, s.held_positions) : s.expected_start() + n;
    e.write_from = s.computed;
    e.preemptable = s.preemptions < limits_.max_preemptions;
    if (e.admit) e.prompt = s.tokens;
    plan_.push_back({e.seq, e.positions, n});
    r.entries.push_back(std::move(e));
  }
}

}  // namespace tireless
