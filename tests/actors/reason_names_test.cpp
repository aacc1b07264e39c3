// Outcome reasons cross the runtime (names) and the wire (enums) both ways: each name reads
// back as its value, and an unknown value or name falls back as documented.
#include <gtest/gtest.h>

#include "protocol/reason_names.hpp"

namespace tireless::proto {
namespace {

TEST(reason_names, every_reason_round_trips_through_its_name) {
  for (const auto& [value, name] : reason_tables::completion) EXPECT_EQ(completion_reason(reason_name(value)), value) << name;
  for (const auto& [value, name] : reason_tables::rejection) EXPECT_EQ(rejection_reason(reason_name(value)), value) << name;
  for (const auto& [value, name] : reason_tables::cancellation) EXPECT_EQ(cancellation_reason(reason_name(value)), value) << name;
  EXPECT_EQ(reason_name(Rejection::Reason::PROMPT_TOO_LONG), "prompt_too_long");
}

TEST(reason_names, unknown_values_and_names_fall_back) {
  EXPECT_EQ(reason_name(static_cast<Rejection::Reason>(999)), "rejected");
  EXPECT_EQ(rejection_reason("no_such_reason"), Rejection::Reason::OVERLOADED);
  EXPECT_EQ(cancellation_reason(""), Cancellation::Reason::CLIENT);
}

}  // namespace
}  // namespace tireless::proto
