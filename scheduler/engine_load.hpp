#pragma once
// What the engine reports of its load with its credits (scheduler/engine_credits.hpp), and the
// forecast admission makes from it: how long until a request arriving now gets its first token.
//
// The forecast follows how the engine packs a step (scheduler/batch_scheduler.hpp): a step
// takes its time budget; the decodes of the request's tier and above run in every step; a
// lower tier's decodes yield to its prefill within their slack, so they cost only one token
// per their own TPOT target (their share of the time) where work_ahead::lower_tiers_yield
// says so; prefill gets what is left, at least min_step_prefill_tokens a step. Without a time
// budget, a step is max_step_tokens tokens.

#include <array>
#include <cstdint>
#include <vector>

#include "scheduler/step_time_model.hpp"

namespace tireless {

// One priority's share of the engine.
struct tier_load {
  int32_t priority = 0;
  int32_t waiting = 0;            // not holding blocks yet
  int32_t running = 0;            // holding blocks (decoding, or part-way through their prompt)
  int32_t decodes = 0;            // running and past their prompt
  double context = 0;             // positions the decodes attend, summed
  double tpot_seconds = 0;        // the tier's time per output token target (0: none)
  // Prompt tokens not yet computed (waiting requests and running ones part-way through): of
  // prompts whose first token is due before that of a request of the tier arriving now, and of
  // those due after it (infeasible prompts with time to spare: prefilled after it).
  int64_t prompt_tokens = 0, later_tokens = 0;
  // The share of its prompts' tokens the prefix cache held lately (a shared system prompt, an
  // earlier turn): a new prompt of the tier is expected to compute the rest.
  double cached_share = 0;
};

struct engine_load {
  std::array<double, step_time_model::n> step_model{};
  int64_t step_observations = 0;
  int32_t max_step_tokens = 0, max_step_seqs = 0;  // the engine's limits per step
  double step_seconds = 0;         // a step's time budget now; 0: only max_step_tokens limits it
  // The median of actual / predicted step time lately: steps packed to the model's seconds take
  // this many times them (1: the model is right).
  double step_residual = 1;
  std::vector<tier_load> tiers;    // by priority, highest first; empty: not known
  double finished_per_second = 0;  // completions per second (moving average)

  int32_t running() const;
  int32_t waiting() const;
  bool measured() const { return step_observations >= 8 && max_step_tokens > 0; }
};

// What is ahead of a request, and the request itself.
struct work_ahead {
  int32_t priority = 0;
  double prompt_tokens = 0;  // to prefill before its first token, its own included
  double requests = 0;       // requests waiting ahead of it (they join the decodes as they start)
  // Clients refused before it, due back before it (retry reservations): each will need a seat
  // in the batch ahead of it, but they are not in the batch's decodes while it waits.
  double returns = 0;
  // How long a request holds its seat, expected, for use while no completion was measured
  // (engine_load::finished_per_second is 0: a fresh engine, whose batch filled at once): its
  // seats then free together, a whole batch every seat_seconds. 0: not known.
  double seat_seconds = 0;
  // Requests of higher tiers held now (running, waiting, queued, on their way): their tiers
  // keep arriving and take back as many seats of every batch that frees (read with seat_seconds).
  double seats_above = 0;
  // Whether the lower tiers' decodes yield to its prefill, costing it only one token per their
  // own TPOT (as the engine packs a step), and their running requests leave it room in the
  // batch: the view of a tier that is never shed, judged by its own work alone. Otherwise every
  // running decode is charged to every step and to the batch: a margin for the tiers above, as
  // what a sheddable request adds to the batch is what they will have to step beside.
  bool lower_tiers_yield = false;
};

struct first_token_forecast {
  double seconds = 0;            // from now to the first token
  double seconds_per_token = 0;  // of prompt work at this priority's pace (for work arriving meanwhile)
  // The same were the lower tiers' decodes not there (none running, none yielding to it): the
  // pace of the priority's prompts on an engine of its own and its decodes.
  double seconds_per_token_alone = 0;
  double decode_share = 0;       // of each step's time, what the decodes charged to it take
};

// 0 seconds while nothing was measured (load.measured() is false): optimistic.
first_token_forecast forecast_first_token(const engine_load& load, const work_ahead& w);

// Seconds of the engine's time one more decoding token takes (beside the others in a step, at
// the running decodes' mean context, times the model's observed error); 0 while nothing was
// measured. A rate of decode tokens times it is the share of the engine they take.
double decode_token_seconds(const engine_load& load);

}  // namespace tireless
