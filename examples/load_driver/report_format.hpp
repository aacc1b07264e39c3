#pragma once
// The report's small shared helpers: shares, and numbers printed as "-" when there are none.

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace tireless::load {

inline double ratio(int64_t n, int64_t d) {
  return d > 0 ? static_cast<double>(n) / static_cast<double>(d) : std::numeric_limits<double>::quiet_NaN();
}

inline std::string num(double v, const char* format = "{:.0f}") {
  return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(format), v);
}

inline std::string pct(double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.1f}%", 100 * v); }

}  // namespace tireless::load
