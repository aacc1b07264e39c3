#include "actors/system_owner.hpp"

#include <caf/all.hpp>

#include <condition_variable>
#include <exception>
#include <mutex>

namespace tireless {

struct system_owner::control {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false, stopping = false;
  std::exception_ptr error;
  std::function<void(caf::actor_system&)> teardown;
};

system_owner::system_owner(std::function<void(caf::actor_system_config&)> configure,
                           std::function<void(caf::actor_system&)> setup)
    : control_(std::make_shared<control>()) {
  auto c = control_;
  thread_ = std::thread([this, c, configure = std::move(configure), setup = std::move(setup)] {
    caf::actor_system_config cfg;
    configure(cfg);
    caf::actor_system sys{cfg};
    bool ok = true;
    try {
      system_ = &sys;
      setup(sys);
    } catch (...) {
      ok = false;
      std::lock_guard lock(c->mu);
      c->error = std::current_exception();
    }
    {
      std::unique_lock lock(c->mu);
      c->ready = true;
      c->cv.notify_all();
      if (ok) c->cv.wait(lock, [&] { return c->stopping; });
    }
    if (ok && c->teardown) c->teardown(sys);
    // ~actor_system() here, on the thread that created it.
  });
  std::unique_lock lock(c->mu);
  c->cv.wait(lock, [&] { return c->ready; });
  if (c->error) {
    lock.unlock();
    thread_.join();
    std::rethrow_exception(c->error);
  }
}

system_owner::~system_owner() {
  if (thread_.joinable()) stop(nullptr);
}

void system_owner::stop(std::function<void(caf::actor_system&)> teardown) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(control_->mu);
    control_->teardown = std::move(teardown);
    control_->stopping = true;
    control_->cv.notify_all();
  }
  thread_.join();
  system_ = nullptr;
}

}  // namespace tireless
