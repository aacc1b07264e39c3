#pragma once
// Shared by the batch scheduler's two sources (batch_scheduler.cpp, batch_step.cpp); not part
// of its interface.

#include <cstdint>
#include <limits>

namespace tireless::batch_detail {

template <class Sequence>
bool is_decode(const Sequence& s) {
  return s.running && static_cast<int32_t>(s.tokens.size()) - s.computed == 1;
}

inline constexpr int64_t no_deadline = std::numeric_limits<int64_t>::max();

}  // namespace tireless::batch_detail
