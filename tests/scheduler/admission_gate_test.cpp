#include "scheduler/admission_gate.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace tireless {
namespace {

// The gate never makes the arriving thread wait: while the admission actor holds the lock, it
// answers "not refused here" and the request takes the long way to the actor.
TEST(admission_gate, an_arriving_thread_never_waits_for_the_lock) {
  tier_settings t;
  t.name = "t";
  t.priority = 1;
  t.queue_bound = 0;  // every arrival is refused
  admission_gate gate(admission_policy::priority, {}, {t}, {});
  const arrival a{1, "", "t", 10, 10, 0};
  ASSERT_TRUE(gate.try_refuse(a).has_value());
  {
    auto held = gate.lock();
    std::optional<admission_decision> seen = admission_decision{};
    std::thread other([&] { seen = gate.try_refuse(a); });
    other.join();  // would hang here if try_refuse waited
    EXPECT_FALSE(seen.has_value());
  }
  EXPECT_TRUE(gate.try_refuse(a).has_value());
}

}  // namespace
}  // namespace tireless
