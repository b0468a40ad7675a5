// A persistent thread pool for kernels. Workers stay alive for the process and spin briefly
// before sleeping, so a decode step that calls hundreds of small kernels pays a wake-up only when
// the pool was idle. Work is handed out in fixed chunks from an atomic counter: which thread
// runs a chunk varies, but each index is computed by exactly one call, so results do not depend
// on the thread count as long as kernels keep each output's reduction inside one index.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace deepinfer {

// A non-owning reference to a callable `void(int64_t begin, int64_t end)`; a temporary callable
// lives through the call it is passed to.
class RangeFn {
 public:
  template <typename F>
  RangeFn(F&& f) : obj_(&f), call_(&invoke<std::remove_reference_t<F>>) {}  // NOLINT: implicit
  void operator()(int64_t b, int64_t e) const { call_(obj_, b, e); }

 private:
  template <typename F>
  static void invoke(void* o, int64_t b, int64_t e) {
    (*static_cast<F*>(o))(b, e);
  }
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

class ThreadPool {
 public:
  // `n_threads` counts the calling thread: 1 means no workers.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of `grain` (the last may be shorter), spread over
  // the pool; the caller takes part and returns when all chunks are done. A call from inside a
  // pool task runs serially on that thread. Exceptions must not escape fn.
  void parallel_for(int64_t n, int64_t grain, RangeFn fn);

  // The process-wide pool, sized by DEEPINFER_NUM_THREADS or the hardware's thread count.
  static ThreadPool& global();
  // Resizes the global pool (tests and benchmarks sweep thread counts).
  static void set_global_threads(int n);

 private:
  void worker_main();
  void run_chunks(const RangeFn& fn);

  int n_threads_;
  std::vector<std::thread> workers_;
  // The current job: published by bumping `generation_`.
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace deepinfer
