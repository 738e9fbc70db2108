// The GEMM kernels' layouts and the choice among variants: the AMX kernel's activation and
// weight layouts and blocking on the software model of the tiles (any AVX-512 CPU), both bf16
// kernels' activation rounding against the scalar rounding with special values, and which variant
// the backend picks and refuses (gemm_variants_test.cc: each variant against float64).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/kernel_select.h"
#include "kernels/weight_layout.h"
#include "tests/kernels/gemm_weight.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::MakeWeight;
using testing::RandomFloats;
using testing::Weight;

// The AMX kernel's layouts (activations padded to tiles, weights stored as AMX tiles or repacked
// into them from the other two layouts) and blocking, checked on any AVX-512 CPU with the tile instructions
// computed in software to their documented semantics; the hardware path itself is gated by its
// self-check in a child process where AMX exists.
TEST(AmxKernelTest, LayoutsAndBlockingMatchFloat64InEmulation) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "the repacking needs AVX-512 (cpuid avx512f/bw/vl/dq)";
  uint32_t seed = 500;
  for (WeightLayout layout : {WeightLayout::kTiled8, WeightLayout::kRowMajor, WeightLayout::kAmxTiles}) {
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 16, 32}, {1, 13, 37}, {5, 40, 200},
                                                              {33, 24, 64}, {70, 9, 100}, {3, 130, 31},
                                                              {17, 20, 40}, {20, 16, 96}, {64, 72, 96}}) {
      SCOPED_TRACE(absl::StrFormat("%s m=%d n=%d k=%d", WeightLayoutName(layout), m, n, k));
      const Weight w = MakeWeight(n, k, DType::kBF16, layout, ++seed);
      const auto x = RandomFloats(static_cast<size_t>(m * k), ++seed);
      // What gemm.cc's planner does for amx: padded rows, items of 32 weight rows and 32 x rows.
      auto run = [&](const float* xs, int64_t rows_x, float* y, bool accumulate = false) {
        std::vector<uint16_t> xp(static_cast<size_t>(cpu_fast::PaddedAmxElems(rows_x, k)), 0xffff);
        cpu_fast::PadRowsAmx(xs, rows_x, k, 0, RoundUp(rows_x, cpu_fast::kAmxRowBlock), xp.data());
        const cpu_fast::GemmTask t{xs, rows_x, w.ref, y, accumulate};
        cpu_fast::GemmScratch scratch;
        const int64_t chunk = rows_x <= cpu_fast::kDirectMaxRows ? rows_x : cpu_fast::kAmxRowChunk;
        for (int64_t tile = 0; tile * cpu_fast::kAmxItemRows < n; ++tile) {
          for (int64_t m0 = 0; m0 < rows_x; m0 += chunk) {
            cpu_fast::TileAmxEmulated(t, xp.data(), {0, tile, m0, std::min(rows_x, m0 + chunk)}, &scratch);
          }
        }
      };
      std::vector<float> y(static_cast<size_t>(m * n)), alone(static_cast<size_t>(n));
      run(x.data(), m, y.data());
      // Accumulating adds the same products to what y held (the tiles' result, then one add).
      const auto init = RandomFloats(static_cast<size_t>(m * n), ++seed);
      std::vector<float> added = init;
      run(x.data(), m, added.data(), true);
      for (size_t e = 0; e < added.size(); ++e) ASSERT_EQ(added[e], init[e] + y[e]) << "accumulated element " << e;
      std::vector<uint16_t> xr(static_cast<size_t>(m * RoundUp(k, 8)));
      cpu_fast::RoundRowsToBf16(x.data(), m, k, xr.data());
      for (int64_t i = 0; i < m; ++i) {
        run(x.data() + i * k, 1, alone.data());
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < k; ++c) {
            float xe;
            const uint32_t bits = static_cast<uint32_t>(xr[i * RoundUp(k, 8) + c]) << 16;
            std::memcpy(&xe, &bits, sizeof(xe));
            ref += static_cast<double>(xe) * w.values[j * k + c];
            mag += std::abs(static_cast<double>(xe) * w.values[j * k + c]);
          }
          const double bound = (static_cast<double>(k) + 9) * std::ldexp(1.0, -24) * mag + 1e-30;
          ASSERT_LE(std::abs(y[i * n + j] - ref), bound) << "row " << i << " col " << j << ": " << y[i * n + j] << " vs " << ref;
          ASSERT_EQ(y[i * n + j], alone[j]) << "row " << i << " col " << j << " depends on its batch mates";
        }
      }
    }
  }
}

// Random floats with ties, NaNs, infinities, denormals and the largest floats (which round to
// infinity) among them.
std::vector<float> FloatsWithSpecials(int64_t n, std::mt19937& gen) {
  const uint32_t specials[] = {0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u, 0x00000001u,
                               0x807fffffu, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x00000000u, 0x80000000u};
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    uint32_t bits = gen();
    if (gen() % 5 == 0) bits = specials[gen() % std::size(specials)];
    if (gen() % 7 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // a tie
    std::memcpy(&v, &bits, sizeof(v));
  }
  return x;
}

// The AMX activations (vector rounding, tile-blocked layout, zero padding) against the scalar
// rounding every other bf16 path uses, bit for bit, with those special values.
TEST(AmxKernelTest, PaddedActivationsAreTheScalarRoundingInTileOrder) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "the rounding needs AVX-512 (cpuid avx512f/bw/vl/dq)";
  std::mt19937 gen(71);
  for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {17, 100}, {33, 64}, {40, 2051}}) {
    const std::vector<float> x = FloatsWithSpecials(m * k, gen);
    const int64_t rows = RoundUp(m, cpu_fast::kAmxRowBlock), kp = RoundUp(k, 32);
    std::vector<uint16_t> tiles(static_cast<size_t>(cpu_fast::PaddedAmxElems(m, k)), 0xffff);
    // In two pieces, as the planner spreads them over threads: rows [0, 32), then the rest.
    cpu_fast::PadRowsAmx(x.data(), m, k, 0, std::min<int64_t>(rows, 32), tiles.data());
    cpu_fast::PadRowsAmx(x.data(), m, k, std::min<int64_t>(rows, 32), rows, tiles.data());
    std::vector<uint16_t> scalar(static_cast<size_t>(m * RoundUp(k, 8)));
    cpu_fast::RoundRowsToBf16(x.data(), m, k, scalar.data());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < kp; ++c) {
        const uint16_t got = tiles[static_cast<size_t>(((i / 16) * (kp / 32) + c / 32) * 512 + (i % 16) * 32 + c % 32)];
        const uint16_t want = i < m && c < k ? scalar[static_cast<size_t>(i * RoundUp(k, 8) + c)] : 0;
        ASSERT_EQ(got, want) << "m=" << m << " k=" << k << " row " << i << " col " << c;
      }
    }
  }
}

// The avx512-bf16 kernel's packed activations (vector rounding, 12-row blocks of 8-column chunks,
// zero padding) against the scalar rounding, bit for bit, the same special values.
TEST(Bf16KernelTest, PackedActivationsAreTheScalarRoundingInBlockOrder) {
  if (!DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "compiled for AVX512-BF16 (cpuid avx512_bf16)";
  std::mt19937 gen(73);
  for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {13, 8}, {17, 100}, {25, 24}, {40, 2051}}) {
    const std::vector<float> x = FloatsWithSpecials(m * k, gen);
    const int64_t rows = RoundUp(m, cpu_fast::kBf16RowBlock), k8 = RoundUp(k, 8);
    std::vector<uint16_t> packed(static_cast<size_t>(cpu_fast::PackedBf16Elems(m, k)), 0xffff);
    // In two pieces, as the planner spreads them over threads: the first block, then the rest.
    const int64_t first = std::min<int64_t>(rows, cpu_fast::kBf16RowBlock);
    cpu_fast::PackRowsBf16(x.data(), m, k, 0, first, packed.data());
    cpu_fast::PackRowsBf16(x.data(), m, k, first, rows, packed.data());
    std::vector<uint16_t> scalar(static_cast<size_t>(m * k8));
    cpu_fast::RoundRowsToBf16(x.data(), m, k, scalar.data());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < k8; ++c) {
        const int64_t at = (i / cpu_fast::kBf16RowBlock) * k8 * cpu_fast::kBf16RowBlock +
                           (c / 8) * cpu_fast::kBf16RowBlock * 8 + (i % cpu_fast::kBf16RowBlock) * 8 + c % 8;
        const uint16_t want = i < m ? scalar[static_cast<size_t>(i * k8 + c)] : 0;
        ASSERT_EQ(packed[static_cast<size_t>(at)], want) << "m=" << m << " k=" << k << " row " << i << " col " << c;
      }
    }
  }
}

TEST(KernelSelectTest, ChoosesTheFastestPassingVariantAndRefusesWhatTheCpuLacks) {
  const absl::StatusOr<CpuIsa> fastest = ChooseCpuIsa(CpuIsa::kAuto, CpuKernelNumerics::kFastest);
  ASSERT_TRUE(fastest.ok()) << fastest.status();
  const absl::StatusOr<CpuIsa> exact = ChooseCpuIsa(CpuIsa::kAuto, CpuKernelNumerics::kExact);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_FALSE(RoundsActivations(*exact)) << CpuIsaName(*exact);
  for (const VariantCheck& v : CheckedVariants()) {
    if (v.passed) {
      EXPECT_GE(static_cast<int>(*fastest), static_cast<int>(v.isa)) << "auto takes the fastest that passed";
      continue;
    }
    const absl::StatusOr<CpuIsa> forced = ChooseCpuIsa(v.isa, CpuKernelNumerics::kFastest);
    ASSERT_FALSE(forced.ok()) << CpuIsaName(v.isa);
    EXPECT_NE(forced.status().message().find(CpuIsaName(v.isa)), std::string::npos) << forced.status();
    if (!v.supported) {
      EXPECT_NE(forced.status().message().find(v.missing), std::string::npos) << forced.status();
    }
  }
  const absl::StatusOr<CpuIsa> conflict = ChooseCpuIsa(CpuIsa::kAvx512Bf16, CpuKernelNumerics::kExact);
  ASSERT_FALSE(conflict.ok());
  EXPECT_NE(conflict.status().message().find("--cpu-kernel exact"), std::string::npos) << conflict.status();
  EXPECT_FALSE(ParseCpuIsa("sse4").ok());
  EXPECT_EQ(*ParseCpuIsa("avx512-bf16"), CpuIsa::kAvx512Bf16);
  EXPECT_EQ(*ParseCpuIsa("amx-model"), CpuIsa::kAmxModel);
  EXPECT_NE(*fastest, CpuIsa::kAmxModel) << "auto never takes the model";
  const absl::StatusOr<CpuIsa> model = ChooseCpuIsa(CpuIsa::kAmxModel, CpuKernelNumerics::kFastest);
  if (DetectCpuFeatures().avx512_bf16) {
    EXPECT_TRUE(model.ok()) << model.status();
  } else {
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.status().message().find("avx512_bf16"), std::string::npos) << model.status();
  }
  const absl::StatusOr<CpuIsa> model_exact = ChooseCpuIsa(CpuIsa::kAmxModel, CpuKernelNumerics::kExact);
  ASSERT_FALSE(model_exact.ok());
  EXPECT_NE(model_exact.status().message().find("--cpu-kernel exact"), std::string::npos) << model_exact.status();
}

// The amx-model backend makes the amx variant's choices (its weight layout, tile attention) under
// a numerics name of its own, so KV records of the model and of the hardware never mix.
TEST(KernelSelectTest, TheAmxModelBackendIsTheAmxVariantUnderItsOwnName) {
  if (!DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "this CPU lacks cpuid flag avx512_bf16";
  CpuBackend model{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAmxModel, CpuKernelNumerics::kFastest}};
  ASSERT_EQ(model.isa(), CpuIsa::kAmxModel);
  EXPECT_EQ(model.PreferredWeightLayout(DType::kBF16), WeightLayout::kAmxTiles);
  EXPECT_EQ(model.PreferredWeightLayout(DType::kF32), WeightLayout::kTiled8);
  EXPECT_TRUE(model.AmxAttention());
  EXPECT_EQ(model.KernelNumerics(), "cpu-fast-4-amx-model-8");
  EXPECT_NE(DescribeVariants(CpuIsa::kAmxModel).find("amx-model: passed"), std::string::npos)
      << DescribeVariants(CpuIsa::kAmxModel);
}

}  // namespace
}  // namespace moeserve
