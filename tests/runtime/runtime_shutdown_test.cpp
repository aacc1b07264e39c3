#include <gtest/gtest.h>

#include <thread>

#include "tireless/runtime.hpp"

namespace tireless {
namespace {

runtime_config sim_config() {
  runtime_config c = load_config(std::string(TIRELESS_SOURCE_DIR) + "/config/sim-h200-k2.toml");
  c.backend.real_time = true;
  return c;
}

// Started on one thread, used from others, stopped from yet another (as tireless-serve does:
// the kj thread submits, a helper thread shuts down). CAF 0.17 hangs in that case unless the
// actor system lives on a thread of its own (system_owner).
TEST(runtime_shutdown, returns_when_called_from_another_thread) {
  auto rt = runtime::start(sim_config());
  std::atomic<int> outcomes{0};
  std::thread user([&] {
    for (int i = 0; i < 5; ++i) {
      request r;
      r.api_key = "sk-sim-free-web";
      r.prompt_tokens = {1000, 1001, 1002};
      r.max_tokens = 4;
      rt->submit(r, nullptr, [&](const outcome&) { ++outcomes; });
    }
    rt->stats();
  });
  user.join();
  std::thread stopper([&] { rt->shutdown(std::chrono::milliseconds(2000)); });
  stopper.join();
  EXPECT_EQ(outcomes.load(), 5);
}

}  // namespace
}  // namespace tireless

