#include "parallel/expert_load_window.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::StatusOr<ExpertLoadWindow> ExpertLoadWindow::Create(int64_t layers, int64_t experts, int64_t steps) {
  const int64_t cells = std::max<int64_t>(1, layers * experts);
  const int64_t most = kMaxBytes / (cells * static_cast<int64_t>(sizeof(int32_t)));
  if (steps < 1 || steps > most) {
    return absl::InvalidArgumentError(absl::StrCat("--eplb-window must be in [1, ", most, "] steps (", layers,
                                                   " layers x ", experts, " experts per step, at most ",
                                                   kMaxBytes >> 20, " MiB of counts), got ", steps));
  }
  ExpertLoadWindow w;
  w.steps_ = steps;
  w.ring_.assign(static_cast<size_t>(steps * layers * experts), 0);
  w.sum_ = ExpertLoad{layers, experts, std::vector<int64_t>(static_cast<size_t>(layers * experts), 0)};
  return w;
}

void ExpertLoadWindow::Add(const std::vector<int64_t>& step) {
  const size_t n = sum_.tokens.size();
  int32_t* row = ring_.data() + static_cast<size_t>(next_) * n;
  for (size_t i = 0; i < n; ++i) {
    // A step routes at most tokens x top-k rows to one expert: far below 2^31.
    const int64_t v = step.size() == n ? std::min<int64_t>(step[i], std::numeric_limits<int32_t>::max()) : 0;
    sum_.tokens[i] += v - row[i];  // the step that held this slot leaves (zero until the ring is full)
    row[i] = static_cast<int32_t>(v);
  }
  next_ = (next_ + 1) % steps_;
  held_ = std::min(held_ + 1, steps_);
}

}  // namespace moeserve
