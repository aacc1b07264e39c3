#pragma once
// From the runtime's threads into the kj event loop, without blocking either side: other
// threads post functions; the loop runs them in order. A poster never waits for the loop
// (no executeSync); the loop never waits for a poster.

#include <kj/async.h>

#include <deque>
#include <functional>
#include <mutex>

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

}  // namespace tireless
