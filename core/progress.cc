// Progress line.
#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace moeserve {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

void Progress::Update(int64_t done, const std::string& detail) {
  if (!enabled_) return;
  const double now = clock_.Seconds();
  if (now - last_draw_ < (tty_ ? 0.1 : 5.0)) return;
  last_draw_ = now;
  Draw(done, detail, false);
}

void Progress::Finish(int64_t done, const std::string& detail) {
  if (!enabled_) return;
  Draw(done, detail, true);
}

void Progress::Draw(int64_t done, const std::string& detail, bool final) {
  std::string bar;
  if (total_ > 0) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * std::clamp<double>(static_cast<double>(done) / total_, 0, 1));
    bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
  }
  const double t = clock_.Seconds();
  char line[512];
  std::snprintf(line, sizeof(line), "%s %s%lld/%lld %s %.1fs", label_.c_str(), bar.c_str(),
                static_cast<long long>(done), static_cast<long long>(total_), detail.c_str(), t);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line, final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

}  // namespace moeserve
