// Monotonic timing helpers.
#pragma once

#include <chrono>

namespace moeserve {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void Reset() { start_ = Clock::now(); }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double Millis() const { return Seconds() * 1e3; }

 private:
  Clock::time_point start_;
};

}  // namespace moeserve
