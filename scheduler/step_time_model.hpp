#pragma once
// A step's duration as the engine measures it, fitted online: seconds ≈ c0 + c1·(prefill
// tokens) + c2·(decode sequences) + c3·(positions the decode tokens attend, in thousands).
// Recursive least squares with forgetting, so the fit follows a changing machine. Admission
// uses it to predict how long the work ahead of a new request will take.
//
// The engine packs its steps to a time budget with this very fit, so the steps it measures
// all last about the same: along the budget's line the features trade off, and nothing tells
// a cheap token from a fixed cost. Forgetting then inflates the uncertainty of what is not
// seen ("covariance wind-up") until noise swings the fit to a step that costs its budget
// whatever it holds: prefill free (c1 <= 0), so the engine packed a whole token budget into one
// step, a 1.3-s stall of every stream (tests/load_driver/random_mixes.py, seed 3). So one step
// never takes more than half of the prefill cost: it may fall, never to zero. (Bounding the
// wind-up itself kept the fit truer but moved the suite both ways, a late bar with it:
// bench/results/step_fit_windup_session19.txt.)

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tireless {

struct step_shape_counts {
  double prefill_tokens = 0;
  double decode_seqs = 0;
  double decode_context = 0;  // Σ over decode tokens of the positions they attend
};

class step_time_model {
 public:
  static constexpr int n = 4;
  explicit step_time_model(double forgetting = 0.995);

  // Fits the step; returns false when it was taken for a stall and left out: a step that took
  // more than stall_ratio times its prediction right after one that did not (a shard's failure
  // and re-run, a paused host) says nothing of what the machine's steps cost, and one such step
  // would skew the fit for hundreds; two in a row are fitted (the machine changed).
  bool observe(const step_shape_counts& shape, double seconds);
  static constexpr double stall_ratio = 4.0;
  // The predicted duration of a step of this shape, never below a tenth of a millisecond;
  // 0 while nothing was observed.
  double predict(const step_shape_counts& shape) const;
  int64_t observations() const { return observations_; }
  const std::array<double, n>& coefficients() const { return theta_; }
  void set_coefficients(const std::array<double, n>& c, int64_t observations);
  // Starts from a prior fit (counted as `weight` observations); measurements then refine it.
  void seed(const std::array<double, n>& prior, int64_t weight);

 private:
  static std::array<double, n> features(const step_shape_counts& s);
  double lambda_;
  std::array<double, n> theta_{};
  std::array<std::array<double, n>, n> p_{};
  int64_t observations_ = 0;
  int64_t measured_ = 0;  // steps fitted (observations_ also counts a seed's weight)
  bool last_was_stall_ = false;
};

// The model's recent error: actual / predicted duration over the last `window` steps. The
// engine packs a step to its time target divided by the 95th percentile of it, so the
// headroom follows how wrong the model has been lately (a host that slows down, a shape the
// fit does not capture) instead of a constant.
class step_residuals {
 public:
  explicit step_residuals(size_t window = 256, size_t min_samples = 32);
  void add(double predicted_seconds, double actual_seconds);  // ignored while predicted <= 0
  // The q-quantile (0..1) of actual / predicted; 1 while fewer than min_samples were added.
  double quantile(double q) const;
  size_t size() const { return count_; }

 private:
  std::vector<double> ratios_;  // a ring
  size_t next_ = 0, count_ = 0, min_samples_;
};

}  // namespace tireless
