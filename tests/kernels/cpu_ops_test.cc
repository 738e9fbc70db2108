// Every CPU op: the fast path against the reference path on fresh random inputs of awkward
// shapes (1, odd sizes, large), for fp32 and bf16 weights and KV (cpu_weight_layout_test.cc:
// the weight layouts the fast path uploads).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/weight_layout.h"
#include "tests/kernels/cpu_ops_fixture.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using cpu_ops_test::CpuOpsTest;
using cpu_ops_test::HostWeight;
using cpu_ops_test::MakeWeight;
using testing::AllClose;
using testing::RandomFloats;

TEST_F(CpuOpsTest, GemmMatchesReference) {
  uint32_t seed = 1;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {1, 7, 3}, {3, 65, 17}, {8, 129, 64}, {9, 64, 127}, {33, 257, 100}, {200, 515, 300}}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(absl::StrFormat("dtype %s m=%d n=%d k=%d accumulate=%d", DTypeShortName(dt), m, n, k, accumulate));
        HostWeight w = MakeWeight(n, k, dt, ++seed);
        auto x = RandomFloats(m * k, ++seed);
        auto init = RandomFloats(m * n, ++seed);
        std::vector<float> y_ref = init, y_fast = init, y_blas = init;
        ref_.Gemm(x.data(), m, w.ref, y_ref.data(), accumulate);
        fast_.Gemm(x.data(), m, w.ref, y_fast.data(), accumulate);
        blas_.Gemm(x.data(), m, w.ref, y_blas.data(), accumulate);
        EXPECT_TRUE(AllClose(y_fast, y_ref, 1e-5, 1e-4)) << "batch-invariant kernel";
        EXPECT_TRUE(AllClose(y_blas, y_ref, 1e-5, 1e-4)) << "OpenBLAS kernel";
      }
    }
  }
}

TEST_F(CpuOpsTest, GemmReferenceMatchesHandComputation) {
  // y = x @ w^T for x = [[1, 2]], w = [[3, 4], [5, 6], [-1, 0.5]].
  std::vector<float> x = {1, 2}, w = {3, 4, 5, 6, -1, 0.5f}, y(3);
  ref_.Gemm(x.data(), 1, WeightRef{w.data(), DType::kF32, 3, 2}, y.data(), false);
  EXPECT_TRUE(AllClose(y, {11, 17, 0}, 0, 0));
}

TEST_F(CpuOpsTest, GroupedGemmMatchesPerGroupGemm) {
  const int64_t k = 48, n = 80;
  std::vector<HostWeight> ws;
  std::vector<WeightRef> refs;
  for (int g = 0; g < 5; ++g) {
    ws.push_back(MakeWeight(n, k, DType::kBF16, 100 + g));
  }
  for (auto& w : ws) refs.push_back(w.ref);
  std::vector<int64_t> offsets = {0, 3, 3, 10, 11, 30};  // one empty group
  auto x = RandomFloats(30 * k, 7);
  std::vector<float> y_fast(30 * n), y_ref(30 * n);
  fast_.GroupedGemm(x.data(), refs, offsets.data(), 30, y_fast.data());
  for (int g = 0; g < 5; ++g) {
    ref_.Gemm(x.data() + offsets[g] * k, offsets[g + 1] - offsets[g], refs[g], y_ref.data() + offsets[g] * n, false);
  }
  EXPECT_TRUE(AllClose(y_fast, y_ref, 1e-5, 1e-4));
}

// The routing plan against an independent oracle: a stable sort of the assignment indices by
// expert. Random ids over 64 experts (many empty, some crowded), several shapes, both paths.
TEST_F(CpuOpsTest, PlanRoutingIsAStableSortOfTheAssignmentsByExpert) {
  std::mt19937 gen(std::random_device{}());
  for (const auto& [n, k, experts] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 4}, {1, 8, 64}, {7, 2, 8}, {300, 6, 64}, {5, 4, 200}}) {
    const int64_t a = n * k;
    std::vector<int32_t> ids(a);
    for (auto& e : ids) e = static_cast<int32_t>(gen() % (gen() % 2 ? experts : std::min<int64_t>(experts, 3)));
    std::vector<int32_t> order(a);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return ids[x] < ids[y]; });
    std::vector<int64_t> want_offsets(experts + 1, 0);
    for (int32_t e : ids) ++want_offsets[e + 1];
    std::partial_sum(want_offsets.begin(), want_offsets.end(), want_offsets.begin());
    std::vector<int32_t> want_gather(a), want_combine(a);
    for (int64_t r = 0; r < a; ++r) {
      want_gather[r] = order[r] / static_cast<int32_t>(k);
      want_combine[order[r]] = static_cast<int32_t>(r);
    }
    for (CpuBackend* b : {&ref_, &fast_}) {
      std::vector<int64_t> offsets(experts + 1, -1);
      std::vector<int32_t> gather(a, -1), combine(a, -1);
      b->PlanRouting(ids.data(), n, k, experts, offsets.data(), gather.data(), combine.data());
      const std::string what = "n=" + std::to_string(n) + " k=" + std::to_string(k) + " experts=" + std::to_string(experts);
      EXPECT_EQ(offsets, want_offsets) << what;
      EXPECT_EQ(gather, want_gather) << what;
      EXPECT_EQ(combine, want_combine) << what;
    }
  }
}

TEST_F(CpuOpsTest, EmbeddingGathersRows) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    HostWeight table = MakeWeight(37, 19, dt, 3, 1.0f);
    std::vector<int32_t> ids = {0, 36, 5, 5, 17};
    std::vector<float> a(ids.size() * 19);
    ref_.Embedding(ids.data(), ids.size(), table.ref, a.data());
    // Row 36 column 4 read independently (every backend against the reference: op_cases.h).
    float direct;
    ConvertToF32(table.bytes.data() + (36 * 19 + 4) * DTypeSize(dt), dt, 1, &direct);
    EXPECT_EQ(a[1 * 19 + 4], direct);
  }
}

// (Every backend against the reference: op_cases.h. Here, the reference against the maths.)
TEST_F(CpuOpsTest, RopePreservesNormAndLeavesPositionZero) {
  const int64_t n = 13, qh = 6, kh = 2, hd = 32;
  auto q = RandomFloats(n * qh * hd, 5), k = RandomFloats(n * kh * hd, 6);
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 397 % 5000);
  auto q1 = q, k1 = k;
  ref_.Rope(q1.data(), k1.data(), pos.data(), n, qh, kh, hd, 10000.0f);
  // A rotation preserves each head's norm; position 0 is the identity.
  double before = 0, after = 0;
  for (int64_t d = 0; d < hd; ++d) {
    before += q[qh * hd + d] * q[qh * hd + d];
    after += q1[qh * hd + d] * q1[qh * hd + d];
  }
  EXPECT_NEAR(after, before, 1e-4 * before);
  for (int64_t d = 0; d < qh * hd; ++d) EXPECT_EQ(q1[d], q[d]) << "position 0 must not rotate";
}

TEST_F(CpuOpsTest, RopeRotateHalfConvention) {
  // head_dim 4, position 1: pairs (0, 2) and (1, 3), frequencies 1 and theta^-0.5.
  std::vector<float> q = {1, 0, 0, 0}, k = {0, 1, 0, 0};
  int32_t pos = 1;
  ref_.Rope(q.data(), k.data(), &pos, 1, 1, 1, 4, 100.0f);
  EXPECT_NEAR(q[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(q[2], std::sin(1.0), 1e-6);
  EXPECT_NEAR(k[1], std::cos(0.1), 1e-6);
  EXPECT_NEAR(k[3], std::sin(0.1), 1e-6);
}

// The fast path's table of angles (kept across calls, grown step by step to the positions seen,
// bypassed past its last row, for a negative position, and for another theta or head size than
// it was filled for) gives the bits of computing them per call.
TEST_F(CpuOpsTest, RopeTableGivesTheAnglesBits) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  ThreadPool pool(2);
  cpu_fast::RopeTable table;
  const int64_t n = 37, qh = 4, kh = 2, edge = cpu_fast::RopeTable::kMaxPositions;
  // Rising largest positions grow the table in steps; then its edge; then other shapes.
  for (const auto& [hd, theta, most] : std::vector<std::tuple<int64_t, float, int32_t>>{
           {64, 10000.0f, 10}, {64, 10000.0f, 100}, {64, 10000.0f, 3000}, {64, 10000.0f, 5000},
           {64, 10000.0f, static_cast<int32_t>(edge + 5000)}, {128, 1e6f, 3000}, {64, 500000.0f, 200}}) {
    std::uniform_int_distribution<int32_t> pick(0, most);
    std::vector<int32_t> pos(n);
    for (int32_t& p : pos) p = pick(gen);
    pos[0] = most, pos[1] = -1;
    if (most > edge) pos[2] = static_cast<int32_t>(edge - 1), pos[3] = static_cast<int32_t>(edge);
    auto q = RandomFloats(n * qh * hd, seed), k = RandomFloats(n * kh * hd, seed + 1);
    auto q1 = q, k1 = k;
    cpu_fast::Rope(pool, q.data(), k.data(), pos.data(), n, qh, kh, hd, theta, nullptr);
    cpu_fast::Rope(pool, q1.data(), k1.data(), pos.data(), n, qh, kh, hd, theta, &table);
    const std::string at = "hd " + std::to_string(hd) + " theta " + std::to_string(theta) + " up to " +
                           std::to_string(most) + " (seed " + std::to_string(seed) + ")";
    EXPECT_EQ(0, std::memcmp(q.data(), q1.data(), q.size() * sizeof(float))) << at;
    EXPECT_EQ(0, std::memcmp(k.data(), k1.data(), k.size() * sizeof(float))) << at;
    if (hd == 64 && theta == 10000.0f) EXPECT_GE(table.positions, std::min<int64_t>(most + 1, edge)) << at;
  }
  EXPECT_EQ(table.head_dim, 64) << "the first shape keeps the table";
  EXPECT_EQ(table.positions, edge);
}

TEST_F(CpuOpsTest, RouterTopKPicksTheLargestLogits) {
  for (auto [n, e, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {5, 8, 2}, {33, 16, 4}, {7, 64, 8}}) {
    for (bool renorm : {true, false}) {
      auto logits = RandomFloats(n * e, n * e + k, 2.0f);
      std::vector<int32_t> ia(n * k);
      std::vector<float> wa(n * k);
      ref_.RouterTopK(logits.data(), n, e, k, renorm, ia.data(), wa.data());
      for (int64_t t = 0; t < n; ++t) {
        // The chosen experts are the k largest logits.
        std::vector<int32_t> order(e);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[t * e + a] > logits[t * e + b]; });
        for (int64_t j = 0; j < k; ++j) EXPECT_EQ(ia[t * k + j], order[j]);
        if (renorm) {
          double s = 0;
          for (int64_t j = 0; j < k; ++j) s += wa[t * k + j];
          EXPECT_NEAR(s, 1.0, 1e-6);
        }
      }
    }
  }
}

// Each output row is its named source row, whole: on one thread (a decode step's few rows) and
// split over the pool (a prefill's megabytes; the split starts at 1 MiB), with rows named
// twice or not at all.
TEST_F(CpuOpsTest, GatherRowsCopiesTheNamedRows) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  for (const auto& [sources, n, dim] : {std::tuple<int64_t, int64_t, int64_t>{27, 27, 21}, {2000, 4000, 512},
                                        {1500, 3001, 97}}) {
    const auto y = RandomFloats(sources * dim, gen());
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (auto& r : rows) r = static_cast<int32_t>(gen() % sources);
    std::vector<float> g(static_cast<size_t>(n * dim), std::nanf(""));
    fast_.GatherRows(y.data(), rows.data(), n, dim, g.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += std::memcmp(&g[i * dim], &y[rows[i] * dim], dim * sizeof(float)) != 0;
    EXPECT_EQ(wrong, 0) << "rows differing from their source, of " << n << " x " << dim << " (seed " << seed << ")";
  }
}

TEST_F(CpuOpsTest, ArenaEnforcesCapacityAndReturnsMemory) {
  CpuBackend small(CpuBackendOptions{CpuPath::kFast, 1, 1 << 20});
  auto a = small.Allocate(600 << 10);
  ASSERT_TRUE(a.ok());
  auto b = small.Allocate(600 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(b.status().message()).find("cannot allocate"), std::string::npos);
  { DeviceBuffer gone = std::move(*a); }
  EXPECT_EQ(small.used_bytes(), 0u);
  EXPECT_TRUE(small.Allocate(600 << 10).ok());
}

// The copy-engine emulation the KV tier tests run under: a copy lands only when waited for, or,
// once ordered before compute, at the next copy or KV op; in issue order; tickets checked.
TEST_F(CpuOpsTest, DeferredCopiesLandOnlyWhenWaitedForOrOrderedBeforeCompute) {
  CpuBackendOptions o;
  o.defer_copies = true;
  CpuBackend b(o);
  auto host = b.AllocateHost(256);
  ASSERT_TRUE(host.ok());
  EXPECT_FALSE(host->pinned());
  auto dev = b.Allocate(256);
  ASSERT_TRUE(dev.ok());
  const auto src = RandomFloats(64, 3);
  std::memcpy(host->data(), src.data(), 256);
  std::memset(dev->data(), 0, 256);
  auto t1 = b.CopyAsync(dev->data(), host->data(), 128);
  auto t2 = b.CopyAsync(dev->as<uint8_t>() + 128, host->data() + 128, 128);
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(*t2, *t1 + 1);
  EXPECT_EQ(dev->as<float>()[0], 0.0f) << "a queued copy landed before anything waited for it";
  ASSERT_TRUE(b.WaitCopy(*t1).ok());
  EXPECT_EQ(0, std::memcmp(dev->data(), src.data(), 128));
  EXPECT_EQ(dev->as<float>()[32], 0.0f) << "WaitCopy ran a later copy";
  b.OrderComputeAfterCopies();
  EXPECT_EQ(dev->as<float>()[32], 0.0f);
  ASSERT_TRUE(b.Synchronize().ok());  // the compute stream meets the ordering
  EXPECT_EQ(0, std::memcmp(dev->data(), src.data(), 256));
  // Device to host, the other way, and a ticket that was never issued.
  std::vector<float> back(64, -1.0f);
  auto t3 = b.CopyAsync(back.data(), dev->data(), 256);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(back[5], -1.0f);
  ASSERT_TRUE(b.WaitCopy(*t3).ok());
  EXPECT_EQ(back, src);
  const absl::Status bad = b.WaitCopy(*t3 + 5);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message()).find("issued"), std::string::npos) << bad;
  // Without the emulation a copy lands at once.
  CpuBackend now;
  std::vector<float> dst(64, 0.0f);
  ASSERT_TRUE(now.CopyAsync(dst.data(), src.data(), 256).ok());
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace moeserve
