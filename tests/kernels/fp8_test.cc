// FP8 weights: float8_e4m3fn conversions against their definition, the fast FP8 GEMM against
// the reference (partial scale groups, tails that are not a multiple of 8, batch sizes 1-9,
// batch invariance), and block quantization of exactly representable values.
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kernel_select.h"
#include "models/host_matrix.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::RandomFloats;

TEST(Fp8Test, EveryCodeRoundTripsAndRoundingIsToNearestEven) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t b = static_cast<uint8_t>(code);
    const float f = F8E4M3ToF32(b);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << code;
      continue;
    }
    // The definition: subnormals m x 2^-9, normals 2^(e-7) (1 + m/8).
    const int e = (b >> 3) & 0xf, m = b & 7;
    const double want = (e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7)) * ((b & 0x80) ? -1 : 1);
    EXPECT_EQ(f, want) << code;
    EXPECT_EQ(F32ToF8E4M3(f) & ((b & 0x7f) == 0 ? 0x7f : 0xff), b & ((b & 0x7f) == 0 ? 0x7f : 0xff)) << code;
  }
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F32ToF8E4M3(1000.0f), 0x7e);             // saturates
  EXPECT_EQ(F32ToF8E4M3(1.0f + 1.0f / 16), 0x38);     // tie between 1 and 1.125: even (1)
  EXPECT_EQ(F32ToF8E4M3(1.0f + 3.0f / 16), 0x3a);     // tie between 1.125 and 1.25: even (1.25)
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.0f, -10)), 0);   // half the smallest subnormal: even (0)
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(3.0f, -10)), 2);   // 1.5 units: even (2)
}

// Random FP8 weights with random per-row, per-128-column scales.
struct Fp8Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  WeightRef ref;
};
Fp8Weight MakeFp8(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  Fp8Weight w;
  w.bytes.resize(static_cast<size_t>(rows * cols));
  for (auto& b : w.bytes) {
    do b = static_cast<uint8_t>(gen()); while ((b & 0x7f) == 0x7f);
  }
  const int64_t groups = (cols + 127) / 128;
  std::uniform_real_distribution<float> u(1e-3f, 4e-3f);
  w.scales.resize(static_cast<size_t>(rows * groups));
  for (auto& s : w.scales) s = u(gen);
  w.ref = WeightRef{w.bytes.data(), DType::kF8E4M3, rows, cols, WeightLayout::kRowMajor, w.scales.data()};
  return w;
}

TEST(Fp8Test, FastGemmMatchesTheReferenceAndIsBatchInvariant) {
  CpuBackend ref(CpuBackendOptions{CpuPath::kReference, 1, 0});
  // The exact (fp32-activation) kernels; the bf16 variants' have a test of their own below.
  CpuBackend fast(CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 203}, {64, 256}, {5, 7}, {130, 300}}) {
    const Fp8Weight w = MakeFp8(rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
    for (int64_t m = 1; m <= 11; ++m) {
      const auto x = RandomFloats(m * cols, static_cast<uint32_t>(m), 1.0f);
      std::vector<float> want(m * rows), got(m * rows);
      ref.Gemm(x.data(), m, w.ref, want.data(), false);
      fast.Gemm(x.data(), m, w.ref, got.data(), false);
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double{got[i]} - want[i]));
        max_ref = std::max(max_ref, std::fabs(double{want[i]}));
      }
      EXPECT_LT(max_err, 1e-5 * std::max(1.0, max_ref))
          << rows << "x" << cols << " m " << m << ": max-abs " << max_err << " (relative " << max_err / max_ref << ")";
      for (int64_t i = 0; i < m; ++i) {  // each row alone gives the same bits
        std::vector<float> one(rows);
        fast.Gemm(x.data() + i * cols, 1, w.ref, one.data(), false);
        EXPECT_EQ(0, std::memcmp(one.data(), got.data() + i * rows, rows * sizeof(float))) << "m " << m << " row " << i;
      }
      std::vector<float> acc = got;  // accumulate adds onto y
      fast.Gemm(x.data(), m, w.ref, acc.data(), true);
      for (size_t i = 0; i < acc.size(); ++i) ASSERT_FLOAT_EQ(acc[i], 2 * got[i]);
    }
  }
}

// The 16-lane kernel (any variant past avx2) gives the 8-lane kernel's bits, for one row of x
// or many (the widened-row path), with partial groups and odd chunk counts.
TEST(Fp8Test, SixteenLanesGiveTheBitsOfEight) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "needs AVX-512 (cpuid avx512f/bw/vl/dq)";
  CpuBackend eight(CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAvx2, CpuKernelNumerics::kExact});
  CpuBackend sixteen(CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAvx512, CpuKernelNumerics::kExact});
  ASSERT_EQ(eight.isa(), CpuIsa::kAvx2);
  ASSERT_EQ(sixteen.isa(), CpuIsa::kAvx512);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 203}, {20, 136}, {33, 384}}) {
    const Fp8Weight w = MakeFp8(rows, cols, static_cast<uint32_t>(rows + cols));
    for (int64_t m : {1, 3, 4, 5, 13}) {
      const auto x = RandomFloats(m * cols, static_cast<uint32_t>(7 * m), 1.0f);
      std::vector<float> a(m * rows), b(m * rows);
      eight.Gemm(x.data(), m, w.ref, a.data(), false);
      sixteen.Gemm(x.data(), m, w.ref, b.data(), false);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << rows << "x" << cols << " m " << m;
    }
  }
}

// The variants that round activations to bf16 multiply FP8 weights with vdpbf16ps: they must
// equal the reference on bf16-rounded rows of x (bf16 x bf16/256 products are exact in fp32)
// to fp32 accumulation error, and be batch-invariant.
TEST(Fp8Test, TheBf16VariantComputesOnBf16RowsOfXAndIsBatchInvariant) {
  std::string missing;
  if (!CpuSupports(DetectCpuFeatures(), CpuIsa::kAvx512Bf16, &missing)) GTEST_SKIP() << "this CPU lacks " << missing;
  // Skipping only where the CPU lacks it: a kernel that fails the variant's self-check fails here.
  const absl::StatusOr<CpuIsa> isa = ChooseCpuIsa(CpuIsa::kAvx512Bf16, CpuKernelNumerics::kFastest);
  ASSERT_TRUE(isa.ok()) << isa.status();
  CpuBackend ref(CpuBackendOptions{CpuPath::kReference, 1, 0});
  CpuBackend bf16(CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAvx512Bf16, CpuKernelNumerics::kFastest});
  ASSERT_EQ(bf16.isa(), CpuIsa::kAvx512Bf16);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 203}, {64, 256}, {5, 7}, {130, 300}}) {
    const Fp8Weight w = MakeFp8(rows, cols, static_cast<uint32_t>(rows * 7 + cols));
    for (int64_t m : {1, 2, 4, 5, 11}) {
      const auto x = RandomFloats(m * cols, static_cast<uint32_t>(100 + m), 1.0f);
      std::vector<float> xr(x.size());
      for (size_t i = 0; i < x.size(); ++i) xr[i] = Bf16ToF32(F32ToBf16(x[i]));
      std::vector<float> want(m * rows), got(m * rows);
      ref.Gemm(xr.data(), m, w.ref, want.data(), false);
      bf16.Gemm(x.data(), m, w.ref, got.data(), false);
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double{got[i]} - want[i]));
        max_ref = std::max(max_ref, std::fabs(double{want[i]}));
      }
      EXPECT_LT(max_err, 1e-5 * std::max(1.0, max_ref))
          << rows << "x" << cols << " m " << m << ": max-abs " << max_err << " (relative " << max_err / max_ref << ")";
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> one(rows);
        bf16.Gemm(x.data() + i * cols, 1, w.ref, one.data(), false);
        EXPECT_EQ(0, std::memcmp(one.data(), got.data() + i * rows, rows * sizeof(float))) << "m " << m << " row " << i;
      }
    }
  }
}

TEST(Fp8Test, BlockQuantizationKeepsRepresentableValuesExactly) {
  // Values that are FP8 codes times a per-block scale, each block holding a 448: quantizing
  // them gives back the same codes and scales (what a checkpoint's writer did).
  const int64_t rows = 200, cols = 150;
  std::mt19937 gen(3);
  HostMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.values.resize(rows * cols);
  std::vector<float> block_scale = {0.5f, 0.03125f, 2.0f, 0.25f};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t b;
      do b = static_cast<uint8_t>(gen()); while ((b & 0x7f) >= 0x7e);
      if (r % 128 == 0 && c % 128 == 0) b = 0x7e;  // the block's largest magnitude: 448
      m.values[r * cols + c] = F8E4M3ToF32(b) * block_scale[(r / 128) * 2 + c / 128];
    }
  }
  const HostMatrix q = QuantizeFp8(m);
  ASSERT_TRUE(q.fp8);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float back = F8E4M3ToF32(q.bytes[r * cols + c]) * q.scales[r * 2 + c / 128];
      ASSERT_EQ(back, m.values[r * cols + c]) << r << "," << c;
    }
  }
  // A transpose of rows aligned to the blocks keeps every value; one across blocks is refused.
  auto t = q.TransposedRows(0, 128, "w");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(F8E4M3ToF32(t->bytes[5 * 128 + 7]) * t->scales[5], m.values[7 * cols + 5]);
  EXPECT_FALSE(q.TransposedRows(100, 60, "w").ok());
}

}  // namespace
}  // namespace moeserve
