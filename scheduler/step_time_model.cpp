#include "scheduler/step_time_model.hpp"

#include <algorithm>

namespace tireless {

step_time_model::step_time_model(double forgetting) : lambda_(forgetting) {
  for (int i = 0; i < n; ++i) p_[i][i] = 1e4;  // a weak prior: anything fits at first
}

std::array<double, step_time_model::n> step_time_model::features(const step_shape_counts& s) {
  return {1.0, s.prefill_tokens, s.decode_seqs, s.decode_context / 1000.0};
}

bool step_time_model::observe(const step_shape_counts& shape, double seconds) {
  // Only a fit of measured steps tells a stall (a prior is a rough guess).
  const bool stall = measured_ >= 32 && seconds > stall_ratio * predict(shape);
  if (stall && !last_was_stall_) {
    last_was_stall_ = true;
    return false;
  }
  last_was_stall_ = stall;
  const auto x = features(shape);
  std::array<double, n> px{};
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) px[i] += p_[i][j] * x[j];
  double denom = lambda_;
  for (int i = 0; i < n; ++i) denom += x[i] * px[i];
  double error = seconds;
  for (int i = 0; i < n; ++i) error -= theta_[i] * x[i];
  const double prefill_before = theta_[1];
  for (int i = 0; i < n; ++i) theta_[i] += px[i] * error / denom;
  // One step never takes more than half of the prefill cost (see the header): it stays above
  // zero however the fit drifts along the budget's line.
  if (measured_ >= 32 && prefill_before > 0) theta_[1] = std::max(theta_[1], prefill_before / 2);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) p_[i][j] = (p_[i][j] - px[i] * px[j] / denom) / lambda_;
  ++observations_;
  ++measured_;
  return true;
}

double step_time_model::predict(const step_shape_counts& shape) const {
  if (observations_ == 0) return 0.0;
  const auto x = features(shape);
  double t = 0;
  for (int i = 0; i < n; ++i) t += theta_[i] * x[i];
  return std::max(t, 1e-4);
}

void step_time_model::set_coefficients(const std::array<double, n>& c, int64_t observations) {
  theta_ = c;
  observations_ = observations;
}

}  // namespace tireless

namespace tireless {

step_residuals::step_residuals(size_t window, size_t min_samples)
    : ratios_(std::max<size_t>(window, 1)), min_samples_(min_samples) {}

void step_residuals::add(double predicted_seconds, double actual_seconds) {
  if (predicted_seconds <= 0 || actual_seconds < 0) return;
  ratios_[next_] = actual_seconds / predicted_seconds;
  next_ = (next_ + 1) % ratios_.size();
  count_ = std::min(count_ + 1, ratios_.size());
}

double step_residuals::quantile(double q) const {
  if (count_ < std::max<size_t>(min_samples_, 1)) return 1.0;
  std::vector<double> v(ratios_.begin(), ratios_.begin() + static_cast<std::ptrdiff_t>(count_));
  const size_t i = std::min(count_ - 1, static_cast<size_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(count_ - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

void step_time_model::seed(const std::array<double, n>& prior, int64_t weight) {
  theta_ = prior;
  observations_ = weight;
  // Confidence in the prior, per feature scale: a few steps' worth of evidence.
  const std::array<double, n> scale = {1.0, 1e-6, 1e-4, 1e-2};
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) p_[i][j] = 0;
    p_[i][i] = scale[i];
  }
}

}  // namespace tireless
