#pragma once
// A session with a real server: time is the wall clock, and waiting for it runs the kj event
// loop of this thread (where the session's requests and outcomes travel).

#include <kj/async-io.h>

#include <chrono>

#include "target.hpp"

namespace tireless::load {

class wall_clock_session : public target_session {
 public:
  explicit wall_clock_session(kj::AsyncIoContext& io) : io_(io), start_(std::chrono::steady_clock::now()) {}

  double now() override { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  void advance_to(double t) override {
    const double dt = t - now();
    if (dt <= 0) {
      io_.waitScope.poll();
      return;
    }
    io_.provider->getTimer().afterDelay(static_cast<int64_t>(dt * 1e9) * kj::NANOSECONDS).wait(io_.waitScope);
  }

 protected:
  kj::AsyncIoContext& io_;

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tireless::load
