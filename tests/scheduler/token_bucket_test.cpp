#include "scheduler/token_bucket.hpp"

#include <gtest/gtest.h>

namespace tireless {
namespace {

constexpr int64_t second = 1'000'000'000;

TEST(token_bucket, starts_full_and_says_exactly_how_long_until_it_refills) {
  token_bucket b(10, 2);  // 10 at most, 2 a second
  EXPECT_EQ(b.wait_ns(10, 0), 0);
  b.take(10, 0);
  EXPECT_EQ(b.wait_ns(1, 0), second / 2);
  EXPECT_EQ(b.wait_ns(4, 0), 2 * second);
  EXPECT_EQ(b.wait_ns(4, second), second);  // 2 came back in a second
  EXPECT_EQ(b.wait_ns(4, 2 * second), 0);
}

TEST(token_bucket, never_holds_more_than_its_capacity) {
  token_bucket b(10, 2);
  b.take(5, 0);
  EXPECT_EQ(b.wait_ns(10, 100 * second), 0);
  b.take(10, 100 * second);
  EXPECT_GT(b.wait_ns(1, 100 * second), 0);  // a long idle time did not store more than 10
  b.give_back(50, 100 * second);
  EXPECT_EQ(b.wait_ns(10, 100 * second), 0);
  b.take(10, 100 * second);
  EXPECT_GT(b.wait_ns(1, 100 * second), 0);  // giving back more than was taken stops at the capacity
}

TEST(token_bucket, a_request_larger_than_the_capacity_can_never_be_met) {
  token_bucket b(10, 2);
  EXPECT_EQ(b.wait_ns(11, 0), -1);
}

TEST(token_bucket, a_zero_capacity_means_no_limit) {
  token_bucket b;
  EXPECT_TRUE(b.unlimited());
  b.take(1e9, 0);
  EXPECT_EQ(b.wait_ns(1e9, 0), 0);
}

TEST(token_bucket, time_going_backwards_refills_nothing) {
  token_bucket b(10, 2);
  b.take(10, 10 * second);
  EXPECT_EQ(b.wait_ns(2, 5 * second), second);
  EXPECT_EQ(b.wait_ns(2, 11 * second), 0);
}

}  // namespace
}  // namespace tireless
