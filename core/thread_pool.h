// A small fixed-size thread pool with a blocking ParallelFor, owned by whoever needs it
// (the CPU backend owns one); there is no process-wide pool. Workers spin briefly on an atomic
// job counter before sleeping, so the many small parallel loops of a decode step do not each
// pay a futex wake-up (tens of microseconds on a VM); idle pools still sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

// The hardware threads this process may run on (its affinity mask: `taskset`, a cgroup's
// cpuset, mpirun's binding), not all the machine has: more workers than that would time-share.
int UsableCpus();

class ThreadPool {
 public:
  // `num_threads` <= 0 means one per usable CPU (UsableCpus). The caller's thread also works.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), at least `grain` items each
  // (the last may hold fewer), the first ones larger (guided), and returns when all are done.
  // Not reentrant: fn must not call ParallelFor.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;  // orders sleeping workers' checks with job publication and stop
  std::condition_variable work_cv_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};  // bumped per job, after the job fields are set
  // The current job (written before generation_ is bumped, read after it is seen).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;  // the smallest chunk but the last
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> pending_workers_{0};
  std::mutex run_mu_;  // serialises ParallelFor callers
};

}  // namespace moeserve
