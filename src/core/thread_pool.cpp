#include "core/thread_pool.h"

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace deepinfer {

namespace {
thread_local bool t_in_pool_task = false;
constexpr int kSpinIterations = 20000;

// Waits until done(v) holds: spins first (every 64th iteration yields the CPU, so that an
// oversubscribed pool, with more threads than cores, lets the thread with real work run instead
// of spinning against it), then sleeps on the atomic. Returns the value that satisfied done.
template <typename T, typename Done>
T spin_wait(const std::atomic<T>& v, Done done) {
  T cur = v.load(std::memory_order_acquire);
  for (int spin = 0; !done(cur); ++spin) {
    if (spin >= kSpinIterations) {
      v.wait(cur, std::memory_order_acquire);
    } else {
      __builtin_ia32_pause();
      if ((spin & 63) == 63) std::this_thread::yield();
    }
    cur = v.load(std::memory_order_acquire);
  }
  return cur;
}

int default_threads() {
  if (const char* s = std::getenv("DEEPINFER_NUM_THREADS")) {
    const int n = std::atoi(s);
    DI_REQUIRE(n >= 1 && n <= 4096, "DEEPINFER_NUM_THREADS=", s,
               ": expected an integer in [1, 4096]");
    return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? int(hc) : 1;
}

std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(const RangeFn& fn) {
  const int64_t n_chunks = (job_n_ + job_grain_ - 1) / job_grain_;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= n_chunks) break;
    const int64_t b = c * job_grain_;
    fn(b, b + job_grain_ < job_n_ ? b + job_grain_ : job_n_);
  }
}

void ThreadPool::worker_main() {
  uint64_t seen = 0;
  for (;;) {
    seen = spin_wait(generation_, [seen](uint64_t g) { return g != seen; });
    if (stop_.load()) return;
    t_in_pool_task = true;
    run_chunks(*job_);
    t_in_pool_task = false;
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain || t_in_pool_task) {
    for (int64_t b = 0; b < n; b += grain) fn(b, b + grain < n ? b + grain : n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_chunk_.store(0, std::memory_order_relaxed);
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  t_in_pool_task = true;
  run_chunks(fn);
  t_in_pool_task = false;
  // Wait for every worker to finish this generation (each decrements once).
  spin_wait(pending_, [](int p) { return p == 0; });
  job_ = nullptr;
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(default_threads());
  return *g_pool;
}

void ThreadPool::set_global_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool = std::make_unique<ThreadPool>(n);
}

}  // namespace deepinfer
