// A flag that ends every wait of a group of process ranks at once: raised by the rank monitor
// (a peer died or stopped sending heartbeats) or by a timeout, read by every MPI wait loop, so
// that a rank blocked in a collective with a dead peer returns UNAVAILABLE instead of hanging.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

namespace moeserve {

class AbortSignal {
 public:
  // The first message wins: it names the cause, later ones are consequences.
  void Raise(const std::string& message) {
    std::function<void(const std::string&)> callback;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (raised_.load(std::memory_order_relaxed)) return;
      message_ = message;
      raised_.store(true, std::memory_order_release);
      callback = on_raise_;
    }
    if (callback) callback(message);
  }
  // Called once, on the raising thread, when the signal is raised (e.g. to fail the engine).
  void OnRaise(std::function<void(const std::string&)> callback) {
    std::lock_guard<std::mutex> lock(mu_);
    on_raise_ = std::move(callback);
  }
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  std::string message() const {
    std::lock_guard<std::mutex> lock(mu_);
    return message_;
  }

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex mu_;
  std::string message_;
  std::function<void(const std::string&)> on_raise_;
};

}  // namespace moeserve
