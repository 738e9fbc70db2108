// The ranks of an in-process parallel layout as persistent workers: one thread per rank beyond
// the first, started once and kept for the engine's life; rank 0 runs on the caller's thread.
// A step is one Run: every rank executes its part at the same time (they meet in collectives),
// and Run returns when all have returned. No thread is created per step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class RankWorkers {
 public:
  explicit RankWorkers(int num_ranks);
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int num_ranks() const { return static_cast<int>(threads_.size()) + 1; }
  // Calls fn(rank) for every rank concurrently, rank 0 on this thread; returns when every call
  // has returned. fn must not throw. Not reentrant.
  void Run(const std::function<void(int rank)>& fn);

 private:
  void Work(int rank);

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;  // the step being run
  uint64_t generation_ = 0;                       // bumped per step
  int pending_ = 0;                               // worker ranks still running this step
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moeserve
