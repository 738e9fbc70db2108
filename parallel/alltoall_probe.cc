// All-to-all timing.
#include "parallel/alltoall_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

absl::StatusOr<AllToAllTiming> TimeAllToAll(Communicator* comm, int64_t bytes_per_peer, int iters,
                                            int warmup) {
  if (iters < 1 || warmup < 0 || bytes_per_peer < 0) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all probe: iters ", iters, ", warmup ",
                                                   warmup, ", bytes_per_peer ", bytes_per_peer));
  }
  const int n = comm->size();
  std::vector<char> send(static_cast<size_t>(bytes_per_peer * n), 1), recv(send.size());
  const std::vector<int64_t> counts(static_cast<size_t>(n), bytes_per_peer);
  std::vector<double> us, all(static_cast<size_t>(n));
  // A sample is kBackToBack calls after a barrier, as a MoE layer's exchanges follow one another:
  // the ranks leave a barrier up to one link latency apart, a skew that back-to-back exchanges
  // absorb (each takes one latency however the ranks are staggered), so one call timed alone
  // after a barrier would count the skew as well. Per call: the block's time over kBackToBack.
  constexpr int kBackToBack = 4;
  for (int i = 0; i < warmup + iters; ++i) {
    RETURN_IF_ERROR(comm->Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kBackToBack; ++k) {
      RETURN_IF_ERROR(comm->AllToAll(send.data(), counts, recv.data(), counts, Counts::kAgreed));
    }
    const double t =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kBackToBack;
    RETURN_IF_ERROR(comm->AllGather(&t, sizeof(double), all.data()));
    if (i >= warmup) us.push_back(*std::max_element(all.begin(), all.end()));  // the slowest rank's
  }
  std::sort(us.begin(), us.end());
  AllToAllTiming r;
  r.bytes_per_peer = bytes_per_peer;
  r.median_us = us[us.size() / 2];
  r.p90_us = us[us.size() * 9 / 10];
  r.bus_bytes_per_second = static_cast<double>(bytes_per_peer) * (n - 1) / (r.median_us * 1e-6);
  return r;
}

}  // namespace moeserve
