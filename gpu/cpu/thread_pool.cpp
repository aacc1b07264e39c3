#include "gpu/cpu/thread_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <cassert>

namespace tireless::cpu {

namespace {

// A worker polls this many times for the next job before sleeping: decode steps issue
// parallel regions a few microseconds apart, too close for a futex round trip each. Plain
// loads, no PAUSE: under KVM a PAUSE loop triggers pause-loop exits that deschedule the vCPU.
constexpr int poll_iterations = 200000;

inline uint64_t pack(uint32_t tag, uint32_t index) { return (uint64_t{tag} << 32) | index; }

// An index past any job's tasks (they are fewer than 2^31): nothing can be claimed from it.
constexpr uint32_t closed_index = 0xffffffffu;

}  // namespace

thread_pool::thread_pool(int n_threads) {
  assert(n_threads >= 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

thread_pool::~thread_pool() {
  stop_.store(true);
  tag_.fetch_add(1);
  tag_.notify_all();
  for (auto& w : workers_) w.join();
}

void thread_pool::run_chunks(uint32_t tag) {
  uint64_t cur = next_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(cur >> 32) != tag) return;
    const int64_t begin = static_cast<uint32_t>(cur);
    // Acquire: a count or grain of the next job comes with next_ already closed (run), so
    // the claim below fails rather than take a chunk of this job sized by the next one.
    const int64_t n_tasks = n_tasks_.load(std::memory_order_acquire);
    if (begin >= n_tasks) return;
    const int64_t end = std::min(begin + grain_.load(std::memory_order_acquire), n_tasks);
    if (!next_.compare_exchange_weak(cur, pack(tag, static_cast<uint32_t>(end)),
                                     std::memory_order_acq_rel)) {
      continue;
    }
    // The claim is valid, so the job cannot change until this chunk is counted done.
    job_.call(job_.fn, begin, end);
    done_.fetch_add(end - begin, std::memory_order_acq_rel);
    cur = next_.load(std::memory_order_acquire);
  }
}

void thread_pool::run(job fn, int64_t n_tasks, int64_t grain) {
  if (n_tasks <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  assert(n_tasks < (int64_t{1} << 31));
  if (workers_.empty() || n_tasks <= grain) {
    for (int64_t b = 0; b < n_tasks; b += grain) fn.call(fn.fn, b, std::min(b + grain, n_tasks));
    return;
  }
  const uint32_t tag = tag_.load(std::memory_order_relaxed) + 1;
  // Close the finished job first: a worker still in run_chunks with its tag could otherwise
  // read its exhausted index, this job's larger count, and claim a chunk that does not exist
  // (then run this job's function on it, or the last job's after its frame is gone).
  next_.store(pack(tag, closed_index), std::memory_order_seq_cst);
  job_ = fn;
  n_tasks_.store(n_tasks, std::memory_order_release);
  grain_.store(grain, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  next_.store(pack(tag, 0), std::memory_order_release);
  tag_.store(tag, std::memory_order_release);
  tag_.notify_all();
  run_chunks(tag);
  for (int spins = 0; done_.load(std::memory_order_acquire) < n_tasks; ++spins) {
    if (spins > 1000) sched_yield();
  }
}

void thread_pool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = tag_.load(std::memory_order_acquire);
    for (int polls = 0; now == seen; now = tag_.load(std::memory_order_acquire)) {
      if (++polls > poll_iterations) {
        tag_.wait(seen, std::memory_order_acquire);
        polls = 0;
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = now;
    run_chunks(now);
  }
}

}  // namespace tireless::cpu
