#include "scheduler/retry_book.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tireless {
namespace {

constexpr int64_t s = 1'000'000'000;

TEST(retry_book, a_token_is_good_once_for_its_tenant_from_its_due_time_until_its_window_ends) {
  retry_book book;
  const uint64_t t = book.reserve("acme", 2, 100, 10 * s, 2 * s);  // due at 11.9 s, ends at 15 s
  EXPECT_FALSE(book.held(t, "acme", 11 * s)) << "too early";
  EXPECT_FALSE(book.held(t, "other", 12 * s)) << "another tenant's";
  EXPECT_TRUE(book.held(t, "acme", 12 * s));
  EXPECT_FALSE(book.held(t, "acme", 16 * s)) << "past its window";
  EXPECT_TRUE(book.take(t, "acme", 12 * s));
  EXPECT_FALSE(book.take(t, "acme", 12 * s)) << "used up";
}

TEST(retry_book, the_work_reserved_is_summed_by_priority_and_leaves_the_sum_when_taken_or_expired) {
  retry_book book;
  const uint64_t premium = book.reserve("a", 2, 100, 0, 1 * s);  // window ends at 4 s
  book.reserve("b", 1, 30, 0, 10 * s);                           // ends at 20 s
  book.reserve("c", 0, 7, 0, 1 * s);                             // ends at 4 s
  EXPECT_EQ(book.reserved(2, 1 * s).prompt_tokens, 100);
  EXPECT_EQ(book.reserved(1, 1 * s).prompt_tokens, 130);
  EXPECT_EQ(book.reserved(0, 1 * s).prompt_tokens, 137);
  EXPECT_EQ(book.reserved(2, 1 * s).requests, 1);
  EXPECT_EQ(book.reserved(0, 1 * s).requests, 3) << "each return is a request too (a seat in the batch)";
  EXPECT_TRUE(book.take(premium, "a", 1 * s));
  EXPECT_EQ(book.reserved(0, 1 * s).prompt_tokens, 37) << "the client came back: its work is no longer to come";
  EXPECT_EQ(book.reserved(0, 5 * s).prompt_tokens, 30) << "c's window ended (a's, taken, is not taken off twice)";
  EXPECT_EQ(book.reserved(0, 5 * s).requests, 1);
  EXPECT_EQ(book.reserved(0, 21 * s).prompt_tokens, 0);
  EXPECT_EQ(book.reserved(0, 21 * s).requests, 0);
}

TEST(retry_book, many_reservations_held_at_once_are_each_honoured_and_all_expire) {
  // A refusal a millisecond for a minute: the book holds tens of thousands at a time.
  retry_book book;
  const std::vector<std::string> tenants = {"a", "b", "c", "d", "e", "f", "g"};
  std::vector<uint64_t> tokens;
  for (int64_t i = 0; i < 60'000; ++i) {
    tokens.push_back(book.reserve(tenants[static_cast<size_t>(i % 7)], static_cast<int32_t>(i % 3), 10, i * 1'000'000, 5 * s));
    ASSERT_GE(book.reserved(0, i * 1'000'000).prompt_tokens, 10);
  }
  const int64_t end = 60 * s;
  EXPECT_EQ(book.reserved(0, end).prompt_tokens, 8'000 * 10) << "those of the last 8 s (5 s hint, 3 s window) are held";
  EXPECT_TRUE(book.take(tokens.back(), tenants[(60'000 - 1) % 7], end + 5 * s)) << "due 4.75 s after";
  EXPECT_EQ(book.reserved(0, end + 10 * s).prompt_tokens, 0);
}

}  // namespace
}  // namespace tireless
