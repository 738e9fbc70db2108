// Timing helpers: a monotonic clock for durations, wall-clock seconds for deadlines that must
// survive a restart (prompt-cache retention).
#pragma once

#include <chrono>
#include <functional>

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

// Seconds since the Unix epoch.
inline double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A source of wall-clock seconds; tests pass a fake one.
using WallClock = std::function<double()>;

}  // namespace moeserve
