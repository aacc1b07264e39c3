#include "scheduler/step_time_model.hpp"

#include <algorithm>

namespace tireless {

step_time_model::step_time_model(double forgetting) : lambda_(forgetting) {
  for (int i = 0; i < n; ++i) p_[i][i] = 1e4;  // a weak prior: anything fits at first
}

std::array<double, step_time_model::n> step_time_model::features(const step_shape_counts& s) {
  return {1.0, s.prefill_tokens, s.decode_seqs, s.decode_context / 1000.0};
}

void step_time_model::observe(const step_shape_counts& shape, double seconds) {
  const auto x = features(shape);
  std::array<double, n> px{};
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) px[i] += p_[i][j] * x[j];
  double denom = lambda_;
  for (int i = 0; i < n; ++i) denom += x[i] * px[i];
  double error = seconds;
  for (int i = 0; i < n; ++i) error -= theta_[i] * x[i];
  for (int i = 0; i < n; ++i) theta_[i] += px[i] * error / denom;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) p_[i][j] = (p_[i][j] - px[i] * px[j] / denom) / lambda_;
  ++observations_;
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
