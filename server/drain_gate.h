// Counts the generation calls in flight (gRPC streams and HTTP completions) and, once draining starts, refuses new ones, so that a
// graceful shutdown waits for exactly the requests that were running and no longer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace moeserve::server {

class DrainGate {
 public:
  // False once draining: the caller refuses the call with UNAVAILABLE.
  bool TryEnter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return false;
    ++active_;
    return true;
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }
  void StartDraining() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  bool draining() const {
    std::lock_guard<std::mutex> lock(mu_);
    return draining_;
  }
  // Waits until no stream is in flight or the deadline passes; true when idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return active_ == 0; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;
  bool draining_ = false;
};

}  // namespace moeserve::server
