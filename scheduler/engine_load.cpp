#include "scheduler/engine_load.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "scheduler/batch_scheduler.hpp"

namespace tireless {

int32_t engine_load::running() const {
  int32_t n = 0;
  for (const tier_load& t : tiers) n += t.running;
  return n;
}

int32_t engine_load::waiting() const {
  int32_t n = 0;
  for (const tier_load& t : tiers) n += t.waiting;
  return n;
}

first_token_forecast forecast_first_token(const engine_load& l, const work_ahead& w) {
  if (!l.measured()) return {};
  const auto& k = l.step_model;
  const double c0 = std::max(k[0], 0.0), per_prefill = std::max(k[1], 1e-9), per_decode = std::max(k[2], 0.0),
               per_position = std::max(k[3], 0.0) / 1000.0;
  // The decodes that run in every step (this tier's and above, or all of them when steps have
  // no time budget) and the share of the time the lower tiers' decodes need at their TPOT.
  double decodes = 0, context = 0, lower_share = 0, all_decodes = 0, all_context = 0;
  int32_t running_here = 0;
  for (const tier_load& t : l.tiers) {
    all_decodes += t.decodes;
    all_context += t.context;
    if (t.priority >= w.priority || l.step_seconds <= 0 || !w.lower_tiers_yield) {
      decodes += t.decodes;
      context += t.context;
      running_here += t.running;
    } else if (t.tpot_seconds > 0) {
      lower_share += (per_decode * t.decodes + per_position * t.context) / t.tpot_seconds;
    }
  }
  // Those ahead join the decodes as they start: half of them, on average over the wait.
  const double max_seqs = std::max(l.max_step_seqs, 1);
  const double joining = std::clamp(w.requests / 2.0, 0.0, std::max(0.0, max_seqs - decodes));
  context += joining * (all_decodes > 0 ? all_context / all_decodes : 0.0);
  decodes += joining;
  const double decode_seconds = per_decode * decodes + per_position * context;
  // Prompt tokens a step takes, and its seconds.
  const double most = std::max(static_cast<double>(min_step_prefill_tokens), l.max_step_tokens - decodes);
  // With a time budget: the prompt tokens of a step and its seconds, `lower` of the time kept
  // for the lower tiers' decodes.
  auto paced = [&](double lower) {
    const double tokens = std::clamp((l.step_seconds * (1 - lower) - c0 - decode_seconds) / per_prefill,
                                     static_cast<double>(min_step_prefill_tokens), most);
    return std::pair(tokens, std::max(l.step_seconds, (c0 + decode_seconds + tokens * per_prefill) / (1 - lower)));
  };
  double per_step = 0, step = 0;
  if (l.step_seconds > 0) {
    lower_share = std::min(lower_share, 0.9);
    std::tie(per_step, step) = paced(lower_share);
  } else {
    per_step = std::max(1.0, l.max_step_tokens - decodes);
    step = c0 + decode_seconds + per_step * per_prefill;
  }
  // Full steps, then one with what is left (a short remainder does not cost a whole step).
  const double full = std::floor(w.prompt_tokens / per_step);
  const double rest = w.prompt_tokens - full * per_step;
  // Steps take what the model says times its observed error.
  const double actual = std::clamp(l.step_residual, 0.25, 4.0);
  first_token_forecast f;
  f.seconds = actual * (full * step + (rest > 0 ? (c0 + decode_seconds + rest * per_prefill) / (1 - lower_share) : 0.0));
  f.seconds_per_token = actual * step / per_step;
  if (l.step_seconds > 0) {
    const auto [tokens, seconds] = paced(0.0);
    f.seconds_per_token_alone = actual * seconds / tokens;
  } else {
    f.seconds_per_token_alone = f.seconds_per_token;
  }
  f.decode_share = step > 0 ? std::min(decode_seconds / step, 1.0) : 0.0;
  // No room in the batch: it also waits for requests to finish.
  const double excess = (w.lower_tiers_yield ? running_here : l.running()) + w.requests + w.returns + 1.0 - max_seqs;
  if (excess > 0 && l.finished_per_second > 0) {
    f.seconds += excess / l.finished_per_second;
  } else if (excess > 0) {
    f.seconds += std::ceil(excess / std::max(1.0, max_seqs - w.seats_above)) * w.seat_seconds;
  }
  return f;
}

}  // namespace tireless

namespace tireless {

double decode_token_seconds(const engine_load& l) {
  if (!l.measured()) return 0;
  double decodes = 0, context = 0;
  for (const tier_load& t : l.tiers) {
    decodes += t.decodes;
    context += t.context;
  }
  const double per_position = std::max(l.step_model[3], 0.0) / 1000.0;
  const double seconds = std::max(l.step_model[2], 0.0) + per_position * (decodes > 0 ? context / decodes : 0.0);
  return seconds * std::clamp(l.step_residual, 0.25, 4.0);
}

}  // namespace tireless
