// Every op case of op_cases.h on the CPU fast path under each kernel variant this machine
// supports, against the reference path with the same inputs (fresh seed each run). A variant the
// CPU lacks skips, naming the missing flag. (cuda_test runs the same list on the GPU.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/op_cases.h"

namespace moeserve::testing {
namespace {

class OpCasesTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(OpCasesTest, EveryCaseMatchesTheReference) {
  std::string missing;
  if (!CpuSupports(DetectCpuFeatures(), GetParam(), &missing)) GTEST_SKIP() << "this CPU lacks " << missing;
  CpuBackend ref(CpuBackendOptions{CpuPath::kReference, 1, 0});
  CpuBackend fast(CpuBackendOptions{CpuPath::kFast, 2, 0, true, GetParam(), CpuKernelNumerics::kFastest});
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", variant " << CpuIsaName(GetParam()));
  for (const OpCase& c : OpCases()) {
    std::mt19937 g1(seed), g2(seed);
    const std::vector<double> want = c.run(ref, g1), got = c.run(fast, g2);
    ASSERT_EQ(got.size(), want.size()) << c.name;
    double max_abs = 0, max_rel = 0;
    bool ok = true;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(got[i] - want[i]);
      ok &= err <= c.atol + c.rtol * std::fabs(want[i]);  // a NaN fails
      max_abs = std::max(max_abs, err);
      if (want[i] != 0) max_rel = std::max(max_rel, err / std::fabs(want[i]));
    }
    EXPECT_TRUE(ok) << c.name << ": max-abs " << max_abs << ", max-rel " << max_rel << " (atol " << c.atol << ", rtol "
                    << c.rtol << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, OpCasesTest,
                         ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx,
                                           CpuIsa::kAmxModel),
                         [](const auto& info) {
                           std::string n = CpuIsaName(info.param);
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace moeserve::testing
