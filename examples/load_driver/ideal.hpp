#pragma once
// What an ideal engine could have done for the top tier: the most of its requests that could
// have had their first token within the tier's target together, given only the tier's own
// prompts. The engine is the tier's alone (no other tier, no decode, no per-step overhead: a
// shared step pays it once), each prompt takes its prefill work on an idle engine less what a
// prefix cache holding every earlier prompt would hold (runner.cpp), and a stall of the machine
// (an expert group's failure detection) blocks it. So it is an upper
// bound of what any scheduler could put on time: a miss outside this set is the scheduler's,
// one inside it was forced by the tier's own burst.
//
// The requests share one target, so their deadlines are in the order of their arrivals; the
// most on time is then Moore-Hodgson's rule in arrival order over each busy period (Lawler,
// "Knapsack-like scheduling problems, the Moore-Hodgson algorithm and the 'tower of sets'
// property", 1994): when the next one would be late, the longest so far is left out.

#include <cstdint>
#include <utility>
#include <vector>

namespace tireless::load {

struct ideal_request {
  double arrival_s = 0;
  double work_s = 0;  // its prefill on an idle engine, less the per-step overhead; NaN: unknown (infinity: never)
};

// For each request: whether it is in the most on time by `target_s`. A request whose own work
// exceeds the target never is; an unknown one always is (no bound is known). stalls:
// [from, to) intervals in which the engine computes nothing.
std::vector<bool> ideal_on_time(const std::vector<ideal_request>& requests, double target_s,
                                const std::vector<std::pair<double, double>>& stalls = {});

}  // namespace tireless::load
