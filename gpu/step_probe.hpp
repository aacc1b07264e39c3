#pragma once
// A backend's cost prior scaled to the machine it runs on. The prior's shape is fitted once
// (bench/sim_calibrate, on one machine); another machine runs the same steps several times
// slower or faster (the CPU prior, fitted with AVX-512, was 3x optimistic for decodes on an AVX2
// host), and until the engine has measured its own steps, admission's forecasts read the prior:
// a flood on a fresh server was admitted three batches deep where one fit its target.

#include "gpu/backend.hpp"

namespace tireless {

// Times a few synthetic steps on `b`, on KV blocks from 0 on, before it serves anything (its
// pool fresh: zeroed, as the CPU backend's is): a short prompt prefilled three times, then
// decodes of up to `seqs` sequences at once at a chat's context (sampling, as served). The prefill steps' median scales the prior's
// fixed and per-prompt-token costs; the decode steps' median its per-sequence and per-position
// costs. Returns b.cost_prior() unchanged where the pool or the limits leave no room for a probe.
step_cost_prior probe_step_cost(backend& b, int32_t seqs);

}  // namespace tireless
