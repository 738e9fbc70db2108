// A progress line on stderr for long work: redrawn in place on a terminal (at most ten times a
// second), one plain line every few seconds otherwise, so logs stay readable.
#pragma once

#include <cstdint>
#include <string>

#include "core/clock.h"

namespace moeserve {

class Progress {
 public:
  // `enabled` false silences it (--no-progress); `total` 0 hides the bar.
  Progress(std::string label, int64_t total, bool enabled);
  // `done` of `total` finished; `detail` is appended (e.g. "ok 30 failed 2").
  void Update(int64_t done, const std::string& detail = "");
  // Draws the final state and ends the line.
  void Finish(int64_t done, const std::string& detail = "");

 private:
  void Draw(int64_t done, const std::string& detail, bool final);

  std::string label_;
  int64_t total_;
  bool enabled_, tty_;
  Stopwatch clock_;
  double last_draw_ = -1e9;
};

}  // namespace moeserve
