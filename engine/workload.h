// Synthetic workloads for benchmarks and load generators: length distributions, shared
// prefixes and arrival schedules, all seeded.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve {

// "128" (fixed), "64:256" (uniform, inclusive) or "normal:MEAN:STD" (clamped to >= 1).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kNormal } kind = Kind::kFixed;
  double a = 1, b = 1;

  static absl::StatusOr<LengthDist> Parse(const std::string& flag, const std::string& text);
  int64_t Sample(std::mt19937_64& gen) const;
  int64_t Max() const;
  std::string ToString() const;
};

struct WorkloadSpec {
  int64_t num_requests = 64;
  LengthDist prompt_len;
  LengthDist output_len;
  int64_t shared_prefix_len = 0;  // tokens every prompt starts with
  double rate = 0.0;              // requests per second; 0: all at once
  double burstiness = 1.0;        // gamma shape of inter-arrival times; 1 is Poisson
  int32_t vocab = 256;            // prompt tokens are drawn from [0, vocab)
  uint64_t seed = 0;
};

struct WorkloadItem {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  double arrival_seconds = 0.0;  // offset from the start
};

std::vector<WorkloadItem> MakeWorkload(const WorkloadSpec& spec);

}  // namespace moeserve
