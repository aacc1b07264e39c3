#pragma once
// A fixed set of worker threads for the CPU kernels. parallel_for splits a range of tasks
// between the caller and the workers; which thread runs a task never changes its result.
//
// The caller never waits for a worker that has nothing to do: it waits only for chunks
// that a worker claimed and is running. So a descheduled worker (more busy threads than
// cores, as under a parallel test run) costs nothing; the caller runs its share instead.

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace tireless::cpu {

class thread_pool {
 public:
  // n_threads counts the caller: thread_pool(1) runs everything on the calling thread.
  explicit thread_pool(int n_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over consecutive chunks of [0, n_tasks), each at most `grain` long,
  // handed out dynamically; returns when every chunk has run. Not reentrant. Allocates nothing.
  template <class F>
  void parallel_for(int64_t n_tasks, int64_t grain, F&& fn) {
    run({&fn, [](void* f, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(f))(b, e); }},
        n_tasks, grain);
  }

 private:
  struct job {
    void* fn;
    void (*call)(void*, int64_t, int64_t);
  };
  void run(job j, int64_t n_tasks, int64_t grain);
  void worker_loop();
  // Claims and runs chunks of job `tag` until none is left.
  void run_chunks(uint32_t tag);

  std::vector<std::thread> workers_;
  // The job, valid while it has unfinished chunks.
  job job_{};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<int64_t> grain_{1};
  // High 32 bits: the job's tag; low 32 bits: the next chunk to hand out.
  alignas(64) std::atomic<uint64_t> next_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // chunks finished in the current job
  alignas(64) std::atomic<uint32_t> tag_{0};  // bumped for each job; workers wait on it
  std::atomic<bool> stop_{false};
};

}  // namespace tireless::cpu
