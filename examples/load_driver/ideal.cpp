#include "ideal.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tireless::load {

namespace {

// When `work` seconds started at `t` end, the stalls in between added.
double finish_after(double t, double work, const std::vector<std::pair<double, double>>& stalls) {
  for (const auto& [from, to] : stalls) {
    if (to <= t) continue;
    if (from >= t + work) break;
    if (from <= t) {
      t = to;
    } else {
      work -= from - t;
      t = to;
    }
  }
  return t + work;
}

}  // namespace

std::vector<bool> ideal_on_time(const std::vector<ideal_request>& requests, double target_s,
                                const std::vector<std::pair<double, double>>& stalls) {
  std::vector<bool> on_time(requests.size(), false);
  std::vector<std::pair<double, double>> blocked = stalls;
  std::sort(blocked.begin(), blocked.end());
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].arrival_s < requests[b].arrival_s; });
  // The requests kept in the current busy period, in arrival order, and when its work ends.
  std::vector<size_t> busy;
  double busy_end = -1e300;
  auto completions_ok = [&]() {
    double t = -1e300;
    for (size_t i : busy) {
      t = finish_after(std::max(t, requests[i].arrival_s), requests[i].work_s, blocked);
      if (t > requests[i].arrival_s + target_s + 1e-12) return false;
    }
    busy_end = t;
    return true;
  };
  for (size_t i : order) {
    const ideal_request& r = requests[i];
    if (std::isnan(r.work_s)) {
      on_time[i] = true;
      continue;
    }
    if (r.work_s > target_s) continue;
    if (r.arrival_s >= busy_end) {  // the engine was idle: the earlier ones are settled
      for (size_t k : busy) on_time[k] = true;
      busy.clear();
    }
    busy.push_back(i);
    if (!completions_ok()) {
      const auto longest = std::max_element(busy.begin(), busy.end(), [&](size_t a, size_t b) {
        return requests[a].work_s < requests[b].work_s;
      });
      busy.erase(longest);
      completions_ok();
    }
  }
  for (size_t k : busy) on_time[k] = true;
  return on_time;
}

}  // namespace tireless::load
