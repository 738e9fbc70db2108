// Every CPU GEMM variant this machine supports (avx2, avx512, avx512-bf16, amx; the others skip,
// naming the missing cpuid flag) on one list of op cases against a float64 reference, within the
// bound its stated arithmetic implies; batch invariance for every batch size 1-257 with random
// batch mates; and the exact variants bit-identical to avx2. The kernels' layouts and the choice
// among variants: gemm_layouts_test.cc.
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

const VariantCheck& CheckOf(CpuIsa isa) {
  if (isa == CpuIsa::kAmxModel) {  // checked only where asked for
    static const VariantCheck model = SelfCheckVariant(isa);
    return model;
  }
  for (const VariantCheck& v : CheckedVariants()) {
    if (v.isa == isa) return v;
  }
  std::abort();
}

class GemmVariantTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    const VariantCheck& v = CheckOf(GetParam());
    if (!v.supported) GTEST_SKIP() << CpuIsaName(GetParam()) << " not on this CPU: " << v.missing;
    ASSERT_TRUE(v.passed) << CpuIsaName(GetParam()) << " failed its self-check: " << v.detail;
    CpuBackendOptions o;
    o.num_threads = 2;
    o.isa = GetParam();
    backend_ = std::make_unique<CpuBackend>(o);
    ASSERT_EQ(backend_->isa(), GetParam());
  }
  // The activations the variant multiplies: rounded to bf16 where it rounds them (bf16 weights).
  std::vector<float> Effective(const std::vector<float>& x, int64_t m, int64_t k, DType dt) const {
    if (!RoundsActivations(GetParam()) || dt != DType::kBF16) return x;
    const int64_t k8 = RoundUp(k, kTileCols);
    std::vector<uint16_t> b(static_cast<size_t>(m * k8));
    cpu_fast::RoundRowsToBf16(x.data(), m, k, b.data());
    std::vector<float> out(x.size());
    for (int64_t i = 0; i < m; ++i) ConvertToF32(&b[i * k8], DType::kBF16, static_cast<size_t>(k), &out[i * k]);
    return out;
  }
  // The layouts every variant reads, and the one its backend stores weights of `dt` in.
  std::vector<WeightLayout> Layouts(DType dt) const {
    std::vector<WeightLayout> out = {WeightLayout::kTiled8, WeightLayout::kRowMajor};
    if (backend_->PreferredWeightLayout(dt) == WeightLayout::kAmxTiles) out.push_back(WeightLayout::kAmxTiles);
    return out;
  }
  std::unique_ptr<CpuBackend> backend_;
};

TEST_P(GemmVariantTest, MatchesFloat64WithinTheBoundOfItsArithmetic) {
  uint32_t seed = 10;
  double worst = 0, worst_vs_unrounded = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (WeightLayout layout : Layouts(dt)) {
      // {70, 600, 1024}: on amx, two groups of weight tiles (16 and 3) of three x blocks each.
      for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},       {1, 7, 3},      {3, 65, 17},
                                                                {8, 129, 64},    {9, 64, 127},   {33, 257, 100},
                                                                {200, 515, 300}, {64, 96, 2048}, {17, 24, 8},
                                                                {70, 600, 1024}}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrFormat("%s %s m=%d n=%d k=%d accumulate=%d", DTypeShortName(dt),
                                       WeightLayoutName(layout), m, n, k, accumulate));
          const Weight w = MakeWeight(n, k, dt, layout, ++seed);
          const auto x = RandomFloats(static_cast<size_t>(m * k), ++seed);
          const auto init = RandomFloats(static_cast<size_t>(m * n), ++seed);
          std::vector<float> y = init;
          backend_->Gemm(x.data(), m, w.ref, y.data(), accumulate);
          const std::vector<float> xe = Effective(x, m, k, dt);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = accumulate ? init[i * n + j] : 0, exact = ref, mag = 0, mag_x = 0;
              for (int64_t c = 0; c < k; ++c) {
                ref += static_cast<double>(xe[i * k + c]) * w.values[j * k + c];
                exact += static_cast<double>(x[i * k + c]) * w.values[j * k + c];
                mag += std::abs(static_cast<double>(xe[i * k + c]) * w.values[j * k + c]);
                mag_x += std::abs(static_cast<double>(x[i * k + c]) * w.values[j * k + c]);
              }
              // k fp32 additions of exact products, the lane tree and the final accumulate.
              const double u = std::ldexp(1.0, -24);
              const double bound = (static_cast<double>(k) + 9) * u * (mag + std::abs(ref)) + 1e-30;
              const double err = std::abs(y[i * n + j] - ref);
              worst = std::max(worst, err / bound);
              ASSERT_LE(err, bound) << "row " << i << " col " << j << ": " << y[i * n + j] << " vs float64 " << ref;
              // Against the unrounded activations: bf16 rounding (8 significant bits) moves each product by at
              // most 2^-8 of itself.
              const double bound_x = bound + std::ldexp(1.0, -8) * mag_x;
              worst_vs_unrounded = std::max(worst_vs_unrounded, std::abs(y[i * n + j] - exact) / bound_x);
              ASSERT_LE(std::abs(y[i * n + j] - exact), bound_x) << "row " << i << " col " << j;
            }
          }
        }
      }
    }
  }
  std::printf("%s: largest error %.3f of the bound of its arithmetic, %.3f of the bound against fp32 activations\n",
              CpuIsaName(GetParam()), worst, worst_vs_unrounded);
}

// A row's result never depends on its batch mates: for every batch size 1-257, a target row at a
// random position among random rows gives exactly the bits it gives alone.
TEST_P(GemmVariantTest, EveryBatchSizeFrom1To257IsBatchInvariant) {
  std::mt19937 gen(std::random_device{}());
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const int64_t n = 40, k = 136;
    const Weight w = MakeWeight(n, k, dt, backend_->PreferredWeightLayout(dt), gen());
    const auto target = RandomFloats(static_cast<size_t>(k), gen());
    std::vector<float> alone(static_cast<size_t>(n));
    backend_->Gemm(target.data(), 1, w.ref, alone.data(), false);
    for (int64_t b = 1; b <= 257; ++b) {
      auto x = RandomFloats(static_cast<size_t>(b * k), gen());
      const int64_t at = std::uniform_int_distribution<int64_t>(0, b - 1)(gen);
      std::copy(target.begin(), target.end(), x.begin() + at * k);
      std::vector<float> y(static_cast<size_t>(b * n));
      backend_->Gemm(x.data(), b, w.ref, y.data(), false);
      ASSERT_EQ(std::memcmp(&y[at * n], alone.data(), alone.size() * sizeof(float)), 0)
          << DTypeShortName(dt) << " batch " << b << " position " << at;
    }
  }
}

// Grouped GEMMs (the experts of a MoE layer) run the same kernels: each group equals its own GEMM.
TEST_P(GemmVariantTest, GroupedGemmEqualsEachGroupsGemm) {
  const int64_t n = 48, k = 72;
  std::vector<Weight> ws;
  std::vector<WeightRef> refs;
  for (int g = 0; g < 4; ++g) {
    ws.push_back(MakeWeight(n, k, DType::kBF16, backend_->PreferredWeightLayout(DType::kBF16), 70 + g));
  }
  for (const Weight& w : ws) refs.push_back(w.ref);
  const std::vector<int64_t> offsets = {0, 3, 3, 40, 41};
  const auto x = RandomFloats(static_cast<size_t>(41 * k), 9);
  std::vector<float> y(static_cast<size_t>(41 * n));
  backend_->GroupedGemm(x.data(), refs, offsets.data(), 41, y.data());
  for (size_t g = 0; g < refs.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    std::vector<float> one(static_cast<size_t>(rows * n));
    backend_->Gemm(x.data() + offsets[g] * k, rows, refs[g], one.data(), false);
    EXPECT_EQ(std::memcmp(one.data(), &y[offsets[g] * n], one.size() * sizeof(float)), 0) << "group " << g;
  }
}

// Several GEMMs of the same rows (a layer's q, k and v) in one call, with the rows rounded once
// for all: each output has its own Gemm's bits, for bf16 and f32 weights mixed, every layout the
// variant reads, and batch sizes across the inline and pooled conversions.
TEST_P(GemmVariantTest, GemmsOfTheSameRowsEqualEachGemm) {
  const int64_t k = 96;
  for (WeightLayout layout : Layouts(DType::kBF16)) {
    std::vector<Weight> ws;
    ws.push_back(MakeWeight(64, k, DType::kBF16, layout, 81));
    ws.push_back(MakeWeight(16, k, DType::kBF16, layout, 82));
    ws.push_back(MakeWeight(40, k, DType::kF32, WeightLayout::kTiled8, 83));
    ws.push_back(MakeWeight(16, k, DType::kBF16, layout, 84));
    std::vector<WeightRef> refs;
    for (const Weight& w : ws) refs.push_back(w.ref);
    for (int64_t m : {1, 5, 33, 300, 1000}) {
      SCOPED_TRACE(absl::StrFormat("%s m=%d", WeightLayoutName(layout), m));
      const auto x = RandomFloats(static_cast<size_t>(m * k), 90 + static_cast<uint32_t>(m));
      std::vector<std::vector<float>> ys;
      std::vector<float*> outs;
      for (const WeightRef& r : refs) ys.emplace_back(static_cast<size_t>(m * r.rows), -1.0f);
      for (auto& y : ys) outs.push_back(y.data());
      backend_->Gemms(x.data(), m, refs, outs);
      for (size_t i = 0; i < refs.size(); ++i) {
        std::vector<float> one(ys[i].size());
        backend_->Gemm(x.data(), m, refs[i], one.data(), false);
        EXPECT_EQ(std::memcmp(one.data(), ys[i].data(), one.size() * sizeof(float)), 0) << "weight " << i;
      }
    }
  }
}

// RunGemms' shared conversion is keyed on the rows it converts: tasks on the same x pointer with
// other row counts or widths, f32 weights (an exact variant, no conversion) and, on amx, a task
// given its rows already as tiles each get their single-task bits.
TEST_P(GemmVariantTest, TasksOnTheSamePointerKeepTheirOwnRows) {
  const auto x = RandomFloats(static_cast<size_t>(40 * 96), 95);
  const Weight wb = MakeWeight(48, 96, DType::kBF16, backend_->PreferredWeightLayout(DType::kBF16), 96);
  const Weight wk = MakeWeight(24, 64, DType::kBF16, backend_->PreferredWeightLayout(DType::kBF16), 97);
  const Weight wf = MakeWeight(40, 96, DType::kF32, WeightLayout::kTiled8, 98);
  std::vector<cpu_fast::GemmTask> tasks = {{x.data(), 5, wb.ref}, {x.data(), 33, wb.ref}, {x.data(), 5, wk.ref},
                                           {x.data(), 33, wf.ref}, {x.data(), 40, wb.ref}};
  std::vector<uint16_t> tiles;
  if (IsAmx(GetParam())) {  // the rows of a 12 x 96 matrix at the same pointer, as tiles
    tiles.resize(static_cast<size_t>(cpu_fast::PaddedAmxElems(12, 96)));
    cpu_fast::PadRowsAmx(x.data(), 12, 96, 0, RoundUp(12, cpu_fast::kAmxRowBlock), tiles.data());
    tasks.push_back({x.data(), 12, wb.ref});
    tasks.back().x_packed = tiles.data();
  }
  std::vector<std::vector<float>> ys;
  for (cpu_fast::GemmTask& t : tasks) {
    ys.emplace_back(static_cast<size_t>(t.m * t.w.rows), -1.0f);
    t.y = ys.back().data();
  }
  ThreadPool pool(2);
  cpu_fast::RunGemms(pool, tasks, GetParam());
  for (size_t i = 0; i < tasks.size(); ++i) {
    cpu_fast::GemmTask one = tasks[i];
    one.x_packed = nullptr;  // the task alone converts its own rows (the tiles are PadRowsAmx's bits)
    std::vector<float> alone(ys[i].size(), -2.0f);
    one.y = alone.data();
    cpu_fast::RunGemms(pool, std::span(&one, 1), GetParam());
    EXPECT_EQ(std::memcmp(alone.data(), ys[i].data(), alone.size() * sizeof(float)), 0) << "task " << i;
  }
}

// The exact variants differ only in register width: the same bits as avx2.
TEST_P(GemmVariantTest, ExactVariantsGiveAvx2sBits) {
  if (RoundsActivations(GetParam())) GTEST_SKIP() << CpuIsaName(GetParam()) << " rounds activations to bf16";
  CpuBackendOptions o;
  o.isa = CpuIsa::kAvx2;
  CpuBackend avx2(o);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (WeightLayout layout : {WeightLayout::kTiled8, WeightLayout::kRowMajor}) {
      for (int64_t m : {1, 5, 16, 17, 61}) {
        const Weight w = MakeWeight(77, 203, dt, layout, static_cast<uint32_t>(m));
        const auto x = RandomFloats(static_cast<size_t>(m * 203), 3);
        std::vector<float> a(static_cast<size_t>(m * 77)), b(a.size());
        avx2.Gemm(x.data(), m, w.ref, a.data(), false);
        backend_->Gemm(x.data(), m, w.ref, b.data(), false);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << DTypeShortName(dt) << " m=" << m << " tiled=" << (layout == WeightLayout::kTiled8);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmVariantTest,
                         ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx,
                                           CpuIsa::kAmxModel),
                         [](const ::testing::TestParamInfo<CpuIsa>& p) {
                           std::string s = CpuIsaName(p.param);
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

}  // namespace
}  // namespace moeserve
