#include "gpu/cpu/thread_pool.hpp"

#include <algorithm>
#include <cassert>

#if defined(__x86_64__)
#include <immintrin.h>
#define TIRELESS_PAUSE() _mm_pause()
#else
#define TIRELESS_PAUSE() std::this_thread::yield()
#endif

namespace tireless::cpu {

namespace {
// Spin this many times waiting for work before sleeping: a decode step issues a few hundred
// parallel regions a few microseconds apart, too close together for a futex round trip.
constexpr int spin_iterations = 20000;
}  // namespace

thread_pool::thread_pool(int n_threads) {
  assert(n_threads >= 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

thread_pool::~thread_pool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void thread_pool::run_chunks() {
  for (;;) {
    int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_tasks_) return;
    job_.call(job_.fn, begin, std::min(begin + grain_, n_tasks_));
  }
}

void thread_pool::run(job fn, int64_t n_tasks, int64_t grain) {
  if (n_tasks <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n_tasks <= grain) {
    for (int64_t b = 0; b < n_tasks; b += grain) fn.call(fn.fn, b, std::min(b + grain, n_tasks));
    return;
  }
  job_ = fn;
  n_tasks_ = n_tasks;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_chunks();
  while (busy_.load(std::memory_order_acquire) != 0) TIRELESS_PAUSE();
}

void thread_pool::worker_loop() {
  // Generation 0 is the pool's start: a worker that starts late still sees the first job.
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t now;
    while ((now = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < spin_iterations) {
        TIRELESS_PAUSE();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = now;
    if (stop_.load()) return;
    run_chunks();
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace tireless::cpu
