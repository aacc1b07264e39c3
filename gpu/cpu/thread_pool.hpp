#pragma once
// A fixed set of worker threads for the CPU kernels. parallel_for splits a range of tasks
// between the caller and the workers; which thread runs a task never changes its result.

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <thread>
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
  void run_chunks();

  std::vector<std::thread> workers_;
  job job_{};
  int64_t n_tasks_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tireless::cpu
