// The engine's thread: the loop that runs steps, offline runs, start and stop, and what the
// engine does once it has failed (a rank of its MPI job lost), and re-placing experts between
// steps (--eplb-interval).
#include <cstdio>

#include "core/clock.h"
#include "core/status.h"
#include "engine/engine.h"

namespace moeserve {

absl::Status Engine::RunUntilIdle() {
  while (!Idle()) {
    ASSIGN_OR_RETURN(bool ran, Step());
    if (!ran && !Idle() && scheduler_.num_running() == 0 && scheduler_.num_waiting() > 0) {
      // Nothing could be scheduled although requests wait: only possible if a request can
      // never fit, which Submit refuses, so this is a bug.
      return absl::InternalError("engine made no progress with requests waiting");
    }
  }
  return failure();  // OK unless the engine failed (its requests ended with the failure)
}

bool Engine::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_ == 0;
}

void Engine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Fail(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.ok()) failure_ = status.ok() ? absl::UnavailableError("engine failed") : status;
  cv_.notify_all();
}

absl::Status Engine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void Engine::SetFailureCallback(std::function<void(const absl::Status&)> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(callback);
}

void Engine::FailEverything() {
  absl::Status failure;
  std::function<void(const absl::Status&)> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure = failure_;
    callback = on_failure_;
  }
  Intake();  // what was submitted before Submit started refusing
  std::vector<uint64_t> ids;
  for (auto& [id, l] : live_) ids.push_back(id);
  for (uint64_t id : ids) Finish(*live_.at(id), FinishReason::kError, std::string(failure.message()), failure.code());
  if (!failure_handled_) {
    failure_handled_ = true;
    if (callback) callback(failure);
  }
}

void Engine::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      if (!failure_.ok()) {
        // Failed: no more steps; end what is in flight and wait for Stop.
        lock.unlock();
        FailEverything();
        lock.lock();
        cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !incoming_.empty(); });
        continue;
      }
      // Sleep while there is nothing to do; wake for submissions, cancellations and, with
      // requests in flight, every few milliseconds to check deadlines.
      cv_.wait_for(lock, std::chrono::milliseconds(pending_ > 0 ? 0 : 50),
                   [&] { return stop_ || !incoming_.empty() || !cancel_requests_.empty() || pending_ > 0; });
      if (stop_) return;
    }
    auto ran = Step();
    if (!ran.ok()) {
      std::fprintf(stderr, "engine step failed: %s\n", std::string(ran.status().message()).c_str());
    } else if (!*ran) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(2),
                   [&] { return stop_ || !incoming_.empty() || !cancel_requests_.empty(); });
    }
  }
}

void Engine::Stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  // Cancel whatever is left, on this thread now that the loop has stopped.
  Intake();
  std::vector<uint64_t> ids;
  for (auto& [id, l] : live_) ids.push_back(id);
  for (uint64_t id : ids) Finish(*live_.at(id), FinishReason::kCancelled, reason);
}

void Engine::Rebalance(const std::vector<int64_t>& routed, int64_t step) {
  const Stopwatch watch;
  const auto done = rebalancer_->Observe(routed);
  if (!done.has_value()) return;
  DescribeLayout();  // even a failed re-placement leaves the layers before its failure switched
  const int64_t window = rebalancer_->window_steps();
  if (!done->ok()) {
    if (executor_->lost()) {  // a rank process was lost meanwhile: as in a step, the engine fails
      Fail(done->status());
      return;
    }
    // A rank's device full, say: the layers not switched keep their placement, serving goes on.
    std::fprintf(stderr, "EPLB at step %lld: %s (%.1f ms); serving goes on\n", static_cast<long long>(step),
                 std::string(done->status().message()).c_str(), watch.Seconds() * 1e3);
    std::lock_guard<std::mutex> lock(mu_);
    counters_.eplb_seconds += watch.Seconds();
    ++counters_.eplb_failures;
    return;
  }
  const ExpertReplacement& r = **done;
  std::fprintf(stderr,
               "EPLB at step %lld: %lld MoE layers re-placed; busiest EP rank over the mean under the last %lld "
               "steps' routing %.3f -> %.3f; %lld experts copied (%.1f MiB) in %.1f ms\n",
               static_cast<long long>(step), static_cast<long long>(r.layers_changed), static_cast<long long>(window),
               r.imbalance_before, r.imbalance_after, static_cast<long long>(r.experts_copied),
               r.bytes_copied / 1048576.0, r.seconds * 1e3);
  std::lock_guard<std::mutex> lock(mu_);
  if (r.layers_changed > 0) ++counters_.eplb_rearrangements;
  counters_.eplb_experts_copied += r.experts_copied;
  counters_.eplb_bytes_copied += r.bytes_copied;
  counters_.eplb_seconds += watch.Seconds();
  counters_.eplb_rank_imbalance = r.imbalance_after;
}

}  // namespace moeserve
