// Workload generation.
#include "engine/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moeserve {

absl::StatusOr<LengthDist> LengthDist::Parse(const std::string& flag, const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  LengthDist d;
  auto num = [&](const std::string& s, double* out) -> absl::Status {
    if (!absl::SimpleAtod(s, out) || !(*out >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", text,
                                                     "\" must be N, MIN:MAX or normal:MEAN:STD with non-negative numbers"));
    }
    return absl::OkStatus();
  };
  absl::Status s;
  if (parts.size() == 1) {
    s = num(parts[0], &d.a);
    d.b = d.a;
    d.kind = Kind::kFixed;
  } else if (parts.size() == 2) {
    s = num(parts[0], &d.a);
    if (s.ok()) s = num(parts[1], &d.b);
    d.kind = Kind::kUniform;
    if (s.ok() && d.b < d.a) return absl::InvalidArgumentError(absl::StrCat(flag, ": MIN must not exceed MAX in \"", text, "\""));
  } else if (parts.size() == 3 && parts[0] == "normal") {
    s = num(parts[1], &d.a);
    if (s.ok()) s = num(parts[2], &d.b);
    d.kind = Kind::kNormal;
  } else {
    s = num("x", &d.a);
  }
  if (!s.ok()) return s;
  if (d.kind != Kind::kNormal && d.b < 1) return absl::InvalidArgumentError(absl::StrCat(flag, ": lengths must be at least 1"));
  return d;
}

int64_t LengthDist::Sample(std::mt19937_64& gen) const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<int64_t>(a);
    case Kind::kUniform:
      return std::uniform_int_distribution<int64_t>(static_cast<int64_t>(std::max(1.0, a)), static_cast<int64_t>(b))(gen);
    case Kind::kNormal:
      return std::max<int64_t>(1, std::llround(std::normal_distribution<double>(a, b)(gen)));
  }
  return 1;
}

int64_t LengthDist::Max() const {
  return kind == Kind::kNormal ? static_cast<int64_t>(a + 4 * b) : static_cast<int64_t>(b);
}

std::string LengthDist::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat(a);
    case Kind::kUniform:
      return absl::StrCat("uniform(", a, ", ", b, ")");
    case Kind::kNormal:
      return absl::StrCat("normal(", a, ", ", b, ")");
  }
  return "?";
}

std::vector<WorkloadItem> MakeWorkload(const WorkloadSpec& spec) {
  std::mt19937_64 gen(spec.seed);
  std::uniform_int_distribution<int32_t> tok(0, std::max(0, spec.vocab - 1));
  std::vector<int32_t> prefix(spec.shared_prefix_len);
  for (auto& t : prefix) t = tok(gen);
  std::gamma_distribution<double> gap(spec.burstiness, spec.rate > 0 ? 1.0 / (spec.rate * spec.burstiness) : 1.0);
  std::vector<WorkloadItem> items(spec.num_requests);
  double t = 0.0;
  for (auto& it : items) {
    it.prompt = prefix;
    const int64_t n = spec.prompt_len.Sample(gen);
    for (int64_t i = 0; i < n; ++i) it.prompt.push_back(tok(gen));
    if (it.prompt.empty()) it.prompt.push_back(tok(gen));
    it.max_tokens = static_cast<int32_t>(spec.output_len.Sample(gen));
    it.arrival_seconds = t;  // the first request arrives at 0, as in vLLM's benchmark
    if (spec.rate > 0) t += gap(gen);
  }
  return items;
}

}  // namespace moeserve
