// Helpers shared by the test suites: seeded random data and tolerance checks that report the
// max-abs and relative error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/dtype.h"

namespace moeserve::testing {

// A fresh, empty directory under the temporary directory: "moeserve_<tag>_XXXXXX".
inline std::string MakeTempDir(const std::string& tag) {
  char tmpl[512];
  std::snprintf(tmpl, sizeof(tmpl), "%s/moeserve_%s_XXXXXX", std::filesystem::temp_directory_path().c_str(),
                tag.c_str());
  const char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string();
}

// A path under the temporary directory that does not exist yet (for what must create its own
// directory), unique to this process and
// call: "moeserve_<tag>_<pid>_<random>".
inline std::string FreshTempPath(const std::string& tag) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("moeserve_" + tag + "_" + std::to_string(getpid()) + "_" +
                                   std::to_string(std::random_device{}()));
  std::filesystem::remove_all(p);
  return p.string();
}

// A seed no run repeats: print it with a failure to replay the run.
inline uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Passes when |a - e| <= atol + rtol * |e| everywhere; the failure message gives the worst
// element, the max-abs error and the max relative error.
inline ::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                           const std::vector<float>& expected, double atol,
                                           double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  double max_abs = 0.0, max_rel = 0.0;
  size_t worst = 0;
  bool ok = true;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double err = std::fabs(a - e);
    if (!(err <= atol + rtol * std::fabs(e))) {  // also catches NaN
      if (ok || err > max_abs) worst = i;
      ok = false;
    }
    if (err > max_abs || std::isnan(err)) max_abs = err;
    max_rel = std::max(max_rel, err / std::max(std::fabs(e), 1e-12));
  }
  const std::string summary = absl::StrFormat(
      "max-abs error %.3g, max relative error %.3g over %d values (atol %.1g, rtol %.1g)", max_abs,
      max_rel, actual.size(), atol, rtol);
  if (ok) return ::testing::AssertionSuccess() << summary;
  return ::testing::AssertionFailure()
         << summary << "; worst at index " << worst << ": got " << actual[worst] << ", want "
         << expected[worst];
}

}  // namespace moeserve::testing
