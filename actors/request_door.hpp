#pragma once
// The door every request passes before any actor sees it: at most `capacity` requests are
// inside the runtime at once, so no actor's mailbox can outgrow what the door lets in. A
// request that finds the door full is refused at once (overloaded, with a retry hint).

#include <atomic>
#include <cstdint>

namespace tireless {

class request_door {
 public:
  explicit request_door(int64_t capacity) : capacity_(capacity) {}
  // true: the request is in (call leave() when it ends); false: refuse it.
  bool enter() {
    int64_t n = inside_.load();
    while (n < capacity_) {
      if (inside_.compare_exchange_weak(n, n + 1)) return true;
    }
    return false;
  }
  void leave() { inside_.fetch_sub(1); }
  int64_t inside() const { return inside_.load(); }
  int64_t capacity() const { return capacity_; }

 private:
  int64_t capacity_;
  std::atomic<int64_t> inside_{0};
};

}  // namespace tireless
