// All-to-all timing.
#include "parallel/alltoall_probe.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

// Calls per sample: a sample after a barrier holds several calls, as a MoE layer's exchanges
// follow one another (the ranks leave a barrier up to one link latency apart, a skew that
// back-to-back exchanges absorb: each takes one latency however the ranks are staggered).
constexpr int kCallsPerSample = 4;

struct Buffers {
  std::vector<char> send, recv;
  std::vector<int64_t> counts;
};

double NowMicros() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Idle: the sample's calls back to back, the slowest rank's time per call.
absl::StatusOr<double> BackToBackSample(Communicator* comm, Buffers& b) {
  RETURN_IF_ERROR(comm->Barrier());
  const double t0 = NowMicros();
  for (int k = 0; k < kCallsPerSample; ++k) {
    RETURN_IF_ERROR(comm->AllToAll(b.send.data(), b.counts, b.recv.data(), b.counts, Counts::kAgreed));
  }
  const double t = (NowMicros() - t0) / kCallsPerSample;
  std::vector<double> all(static_cast<size_t>(comm->size()));
  RETURN_IF_ERROR(comm->AllGather(&t, sizeof(double), all.data()));
  return *std::max_element(all.begin(), all.end());
}

// Reads every cache line of `sweep`; the empty asm takes the sum as an input, so the loads
// cannot be dropped or moved past the caller's next clock reading.
float Sweep(const std::vector<float>& sweep) {
  float sum = 0;
  for (size_t i = 0; i < sweep.size(); i += 64 / sizeof(float)) sum += sweep[i];
  __asm__ volatile("" ::"g"(sum) : "memory");
  return sum;
}

// In an engine's setting: each call after a sweep, timed from the last entry to the last exit.
absl::StatusOr<double> AfterSweepSample(Communicator* comm, Buffers& b, const std::vector<float>& sweep,
                                        float* sink) {
  std::vector<double> spans(2 * kCallsPerSample);  // entry, exit per call
  RETURN_IF_ERROR(comm->Barrier());
  for (int k = 0; k < kCallsPerSample; ++k) {
    *sink += Sweep(sweep);
    spans[2 * k] = NowMicros();
    RETURN_IF_ERROR(comm->AllToAll(b.send.data(), b.counts, b.recv.data(), b.counts, Counts::kAgreed));
    spans[2 * k + 1] = NowMicros();
  }
  const size_t n = static_cast<size_t>(comm->size());
  std::vector<double> all(spans.size() * n);
  RETURN_IF_ERROR(comm->AllGather(spans.data(), spans.size() * sizeof(double), all.data()));
  double total = 0;
  for (size_t k = 0; k < kCallsPerSample; ++k) {
    double entry = 0, exit = 0;
    for (size_t r = 0; r < n; ++r) {
      entry = std::max(entry, all[r * spans.size() + 2 * k]);
      exit = std::max(exit, all[r * spans.size() + 2 * k + 1]);
    }
    total += exit - entry;
  }
  return total / kCallsPerSample;
}

}  // namespace

absl::StatusOr<AllToAllTiming> TimeAllToAll(Communicator* comm, int64_t bytes_per_peer, int iters, int warmup,
                                            int64_t sweep_bytes) {
  const std::tuple<const char*, int64_t, int64_t> checks[] = {
      {"iters", iters, 1}, {"warmup", warmup, 0}, {"bytes_per_peer", bytes_per_peer, 0}, {"sweep_bytes", sweep_bytes, 0}};
  for (const auto& [name, value, least] : checks) {
    if (value < least) {
      return absl::InvalidArgumentError(absl::StrCat("all-to-all probe: ", name, " must be >= ", least, ", got ", value));
    }
  }
  const int n = comm->size();
  Buffers b{std::vector<char>(static_cast<size_t>(bytes_per_peer * n), 1),
            std::vector<char>(static_cast<size_t>(bytes_per_peer * n)),
            std::vector<int64_t>(static_cast<size_t>(n), bytes_per_peer)};
  const std::vector<float> sweep(static_cast<size_t>(sweep_bytes) / sizeof(float), 1.0f);
  float sink = 0;
  std::vector<double> us;
  for (int i = 0; i < warmup + iters; ++i) {
    ASSIGN_OR_RETURN(const double t, sweep_bytes > 0 ? AfterSweepSample(comm, b, sweep, &sink) : BackToBackSample(comm, b));
    if (i >= warmup) us.push_back(t);
  }
  if (sink < 0) return absl::InternalError("all-to-all probe: the sweep read a negative sum");  // keeps the loads
  std::sort(us.begin(), us.end());
  AllToAllTiming r;
  r.bytes_per_peer = bytes_per_peer;
  r.median_us = us[us.size() / 2];
  r.p90_us = us[us.size() * 9 / 10];
  r.bus_bytes_per_second = r.median_us > 0 ? static_cast<double>(bytes_per_peer) * (n - 1) / (r.median_us * 1e-6) : 0;
  return r;
}

}  // namespace moeserve
