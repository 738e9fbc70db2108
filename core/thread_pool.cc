// ThreadPool: workers wake per job, grab chunks under a mutex, and the caller joins in.
#include "core/thread_pool.h"

#include <algorithm>

namespace moeserve {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  while (true) {
    int64_t begin;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_) return;
      begin = next_;
      next_ = std::min(n_, next_ + chunk_);
    }
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_workers_ == 0) done_cv_.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_parts = (n + grain - 1) / grain;
  if (workers_.empty() || max_parts <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  const int64_t parts = std::min<int64_t>(max_parts, 4 * num_threads());
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + parts - 1) / parts;
    next_ = 0;
    pending_workers_ = static_cast<int64_t>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_workers_ == 0; });
  fn_ = nullptr;
}

}  // namespace moeserve
