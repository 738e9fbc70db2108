// Load level runner.
#include "tools/loadgen/runner.h"

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/progress.h"

namespace moeserve::loadgen {

std::string LevelSpec::Label() const {
  if (closed_loop) return absl::StrCat("concurrency=", concurrency);
  return std::isinf(rate) ? std::string("rate=inf") : absl::StrCat("rate=", rate);
}

LevelRun RunLevel(moeserve::v1::Moeserve::Stub* stub, const LevelSpec& level, const std::vector<WorkloadItem>& items,
                  const RunOptions& options) {
  std::mutex mu;
  std::condition_variable cv;
  LevelRun run;
  int64_t in_flight = 0, failed = 0;
  const int64_t n = static_cast<int64_t>(items.size());
  Progress progress(options.progress_label.empty() ? level.Label() : options.progress_label, n, options.progress);
  const auto origin = Clock::now();

  auto send = [&](const WorkloadItem& item) {
    moeserve::v1::GenerateRequest req;
    auto* ids = req.mutable_token_ids()->mutable_ids();
    ids->Assign(item.prompt.begin(), item.prompt.end());
    req.set_max_tokens(item.max_tokens);
    req.set_ignore_eos(true);  // exact output lengths, as benchmark_serving does
    req.set_priority(options.priority);
    if (options.retain_seconds > 0) req.set_retain_seconds(options.retain_seconds);
    {
      std::lock_guard<std::mutex> lock(mu);
      ++in_flight;
    }
    StartGenerate(stub, std::move(req), options.call, origin, [&](RequestResult r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) ++failed;
      run.results.push_back(std::move(r));
      --in_flight;
      cv.notify_all();
    });
  };
  auto detail = [&] {
    return absl::StrCat("in flight ", in_flight, " ok ", static_cast<int64_t>(run.results.size()) - failed,
                        " failed ", failed);
  };

  int64_t next = 0;
  std::unique_lock<std::mutex> lock(mu);
  while (static_cast<int64_t>(run.results.size()) < n) {
    // Send whatever is due.
    while (next < n) {
      if (level.closed_loop) {
        if (in_flight >= level.concurrency) break;
      } else if (!std::isinf(level.rate)) {
        const auto due = origin + std::chrono::microseconds(static_cast<int64_t>(items[next].arrival_seconds * 1e6));
        if (Clock::now() < due) break;
      }
      lock.unlock();
      send(items[next++]);
      lock.lock();
    }
    progress.Update(static_cast<int64_t>(run.results.size()), detail());
    // Sleep until the next arrival, a completion, or a progress tick.
    auto wake = Clock::now() + std::chrono::milliseconds(100);
    if (!level.closed_loop && !std::isinf(level.rate) && next < n) {
      wake = std::min(wake, origin + std::chrono::microseconds(static_cast<int64_t>(items[next].arrival_seconds * 1e6)));
    }
    const int64_t done_before = static_cast<int64_t>(run.results.size());
    cv.wait_until(lock, wake, [&] { return static_cast<int64_t>(run.results.size()) != done_before; });
  }
  run.duration_seconds = std::chrono::duration<double>(Clock::now() - origin).count();
  progress.Finish(n, detail());
  return run;
}

}  // namespace moeserve::loadgen
