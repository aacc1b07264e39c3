#pragma once
// A token bucket: holds up to `capacity`, refills at `per_second`. take() succeeds or says
// exactly how long until it would.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tireless {

class token_bucket {
 public:
  token_bucket() = default;
  token_bucket(double capacity, double per_second) : capacity_(capacity), rate_(per_second), tokens_(capacity) {}

  bool unlimited() const { return capacity_ <= 0; }
  double capacity() const { return capacity_; }

  // Nanoseconds until `n` tokens are there (0: now; -1: never, n exceeds the capacity).
  int64_t wait_ns(double n, int64_t now_ns) {
    if (unlimited()) return 0;
    refill(now_ns);
    if (n > capacity_) return -1;
    if (tokens_ >= n) return 0;
    return static_cast<int64_t>(std::ceil((n - tokens_) / rate_ * 1e9));
  }
  void take(double n, int64_t now_ns) {
    if (unlimited()) return;
    refill(now_ns);
    tokens_ -= n;
  }
  void give_back(double n, int64_t now_ns) {
    if (unlimited()) return;
    refill(now_ns);
    tokens_ = std::min(capacity_, tokens_ + n);
  }

 private:
  void refill(int64_t now_ns) {
    if (last_ns_ >= 0 && now_ns > last_ns_) tokens_ = std::min(capacity_, tokens_ + rate_ * (now_ns - last_ns_) / 1e9);
    last_ns_ = std::max(last_ns_, now_ns);
  }
  double capacity_ = 0, rate_ = 0, tokens_ = 0;
  int64_t last_ns_ = -1;
};

}  // namespace tireless
