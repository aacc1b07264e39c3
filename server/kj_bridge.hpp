#pragma once
// From the runtime's threads into the kj event loop, without blocking either side: other
// threads post functions; the loop runs them in order. A poster never waits for the loop
// (no executeSync); the loop never waits for a poster.

#include <kj/async.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "tireless/runtime.hpp"

namespace tireless {

class kj_bridge {
 public:
  // Any thread.
  void post(std::function<void()> f) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(f));
    if (waiting_) {
      waiting_->fulfill();
      waiting_ = nullptr;
    }
  }

  // The loop's thread: runs posted functions as they come, until the promise is dropped.
  kj::Promise<void> pump() {
    return next().then([this] {
      std::deque<std::function<void()>> batch;
      {
        std::lock_guard lock(mu_);
        batch.swap(queue_);
      }
      for (auto& f : batch) f();
      return pump();
    });
  }

 private:
  kj::Promise<void> next() {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) return kj::READY_NOW;
    auto pf = kj::newPromiseAndCrossThreadFulfiller<void>();
    waiting_ = kj::mv(pf.fulfiller);
    return kj::mv(pf.promise);
  }

  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiting_;
};

// The runtime's stats, on the loop. The runtime answers on one of its threads, where the last
// reference to the fulfiller may also go: a cross-thread fulfiller may be fulfilled and dropped
// there (a plain one belongs to the event loop's thread alone: ThreadSanitizer caught one
// freed on a CAF thread).
inline kj::Promise<runtime_stats> runtime_stats_promise(runtime& rt) {
  auto pf = kj::newPromiseAndCrossThreadFulfiller<runtime_stats>();
  auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<runtime_stats>>>(kj::mv(pf.fulfiller));
  rt.stats_async([fulfiller](const runtime_stats& s) { (*fulfiller)->fulfill(runtime_stats(s)); });
  return kj::mv(pf.promise);
}

}  // namespace tireless
