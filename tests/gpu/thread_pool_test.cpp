// The CPU thread pool: every task of a parallel_for runs exactly once, before it returns, and
// never after (a worker running a finished job's function would call into a dead stack frame:
// the crash a late claim once caused under a loaded server).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "gpu/cpu/thread_pool.hpp"

namespace tireless::cpu {
namespace {

// Jobs of alternating sizes, a short one (exhausted quickly) then a longer one: a worker that
// read the short job's last chunk index and the long job's task count could claim a chunk of
// the short job that does not exist and run it with the long job's function.
TEST(thread_pool, every_task_runs_exactly_once_and_only_inside_its_parallel_for) {
  thread_pool pool(3);
  std::atomic<int64_t> stale{0};
  int64_t wrong = 0;
  for (int round = 0; round < 200000; ++round) {
    const int64_t n = round % 2 == 0 ? 2 + round % 5 : 40 + round % 23;
    std::vector<std::atomic<int32_t>> runs(static_cast<size_t>(n));
    std::atomic<bool> open{true};
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      if (!open.load(std::memory_order_acquire)) stale.fetch_add(1);
      for (int64_t i = begin; i < end; ++i) {
        if (i < 0 || i >= n) {
          stale.fetch_add(1);
          continue;
        }
        runs[static_cast<size_t>(i)].fetch_add(1);
      }
    });
    open.store(false, std::memory_order_release);
    for (const auto& r : runs) wrong += r.load() != 1;
  }
  EXPECT_EQ(wrong, 0) << "tasks that ran zero times or more than once";
  EXPECT_EQ(stale.load(), 0) << "chunks run outside their job's range or after it returned";
}

TEST(thread_pool, a_single_thread_pool_runs_everything_on_the_caller) {
  thread_pool pool(1);
  std::vector<int> seen(10, 0);
  pool.parallel_for(10, 3, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++seen[static_cast<size_t>(i)];
  });
  for (int s : seen) EXPECT_EQ(s, 1);
}

}  // namespace
}  // namespace tireless::cpu
