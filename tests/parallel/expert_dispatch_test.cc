// parallel/expert_dispatch: one MoE layer's experts spread over thread ranks (LocalCommunicator,
// a CPU backend each) against the same layer on one device, on fresh random tokens, routing and
// weights: every token's output equals the one device's bit for bit (the kernels are
// batch-invariant), for contiguous and round-robin placement, the fp32 and bf16 wires, and a
// rank without tokens; and a rank with tokens copies to the host once per layer (the experts'
// row counts), a rank without none: the rows are planned on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "kernels/cpu/cpu_backend.h"
#include "parallel/comm_group.h"
#include "parallel/expert_dispatch.h"
#include "parallel/placement.h"

namespace moeserve {
namespace {

constexpr int64_t kExperts = 8, kTopK = 2, kHidden = 32, kInter = 24;

std::vector<float> Normal(std::mt19937& g, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

// One rank's tokens: normalised states, routing (k distinct experts each), router weights, and
// the residual the layer adds into.
struct Tokens {
  int64_t t = 0;
  std::vector<float> xn, w, x;
  std::vector<int32_t> ids;
};

Tokens MakeTokens(std::mt19937& g, int64_t t) {
  Tokens k{t, Normal(g, t * kHidden, 1.0f), Normal(g, t * kTopK, 0.5f), Normal(g, t * kHidden, 1.0f), {}};
  std::vector<int32_t> all(kExperts);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < t; ++i) {
    std::shuffle(all.begin(), all.end(), g);
    k.ids.insert(k.ids.end(), all.begin(), all.begin() + kTopK);
  }
  return k;
}

// The experts' weights, stored as `dt` (bf16 keeps the rounded values' bits).
struct Experts {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<WeightRef> w13, w2;
};

Experts MakeExperts(std::mt19937& g, DType dt) {
  Experts e;
  for (int64_t i = 0; i < 2 * kExperts; ++i) {
    const bool up = i < kExperts;
    const int64_t rows = up ? 2 * kInter : kHidden, cols = up ? kHidden : kInter;
    const std::vector<float> v = Normal(g, rows * cols, 0.2f);
    e.bytes.emplace_back(v.size() * DTypeSize(dt));
    ConvertFromF32(v.data(), v.size(), dt, e.bytes.back().data());
    (up ? e.w13 : e.w2).push_back(WeightRef{e.bytes.back().data(), dt, rows, cols});
  }
  return e;
}

// The layer on one device (moe_layer.cc's path without expert parallelism), all ranks' tokens.
std::vector<float> OneDevice(const std::vector<Tokens>& ranks, const Experts& ex) {
  Tokens all;
  for (const Tokens& r : ranks) {
    all.t += r.t;
    all.xn.insert(all.xn.end(), r.xn.begin(), r.xn.end());
    all.w.insert(all.w.end(), r.w.begin(), r.w.end());
    all.x.insert(all.x.end(), r.x.begin(), r.x.end());
    all.ids.insert(all.ids.end(), r.ids.begin(), r.ids.end());
  }
  CpuBackendOptions o;
  o.num_threads = 1;
  CpuBackend b(o);
  const int64_t a = all.t * kTopK;
  std::vector<int64_t> offsets(kExperts + 1);
  std::vector<int32_t> gather(a), combine(a);
  std::vector<float> sorted(a * kHidden), gate_up(a * 2 * kInter), act(a * kInter), out(a * kHidden);
  b.PlanRouting(all.ids.data(), all.t, kTopK, kExperts, offsets.data(), gather.data(), combine.data());
  b.GatherRows(all.xn.data(), gather.data(), a, kHidden, sorted.data());
  b.GroupedGemm(sorted.data(), ex.w13, offsets.data(), a, gate_up.data());
  b.SiluMul(gate_up.data(), a, kInter, act.data());
  b.GroupedGemm(act.data(), ex.w2, offsets.data(), a, out.data());
  b.ScatterCombine(out.data(), combine.data(), all.w.data(), all.t, kTopK, kHidden, all.x.data(), true);
  return all.x;
}

// The rows each rank's experts compute, from the rule ExpertDispatch states: sender s's n rows
// of expert e go to e's holders in s's domain of `domain` ranks (0: one domain) where there are
// any, else to all of them; with r such holders, in r runs in token order, run i ([n i / r,
// n (i + 1) / r)) going to the (i + s) mod r-th. rows[rank][expert]; *outside: the rows sent to
// another domain.
std::vector<std::vector<int64_t>> RowsByRule(const std::vector<Tokens>& ranks, const ExpertHolderTable& holders,
                                             int64_t domain, int64_t* outside) {
  std::vector<std::vector<int64_t>> rows(ranks.size(), std::vector<int64_t>(kExperts, 0));
  const int64_t d = domain > 0 ? domain : static_cast<int64_t>(ranks.size());
  *outside = 0;
  for (size_t s = 0; s < ranks.size(); ++s) {
    const int64_t home = static_cast<int64_t>(s) / d;
    for (int64_t e = 0; e < kExperts; ++e) {
      const int64_t n = std::count(ranks[s].ids.begin(), ranks[s].ids.end(), static_cast<int32_t>(e));
      std::vector<int32_t> h;
      for (int32_t q : holders[0][static_cast<size_t>(e)]) {
        if (q / d == home) h.push_back(q);
      }
      if (h.empty()) h = holders[0][static_cast<size_t>(e)];
      const int64_t r = static_cast<int64_t>(h.size());
      for (int64_t i = 0; i < r; ++i) {
        const int32_t to = h[static_cast<size_t>((i + static_cast<int64_t>(s)) % r)];
        rows[static_cast<size_t>(to)][static_cast<size_t>(e)] += n * (i + 1) / r - n * i / r;
        if (to / d != home) *outside += n * (i + 1) / r - n * i / r;
      }
    }
  }
  return rows;
}

// Runs the layer on thread ranks and checks it (see the file's comment); returns the rows the
// rule sends out of their domain.
int64_t CheckLayout(const std::vector<int64_t>& tokens, const ExpertHolderTable& holders, const std::string& placement,
                    DType dt, uint32_t seed, int64_t domain = 0) {
  std::mt19937 g(seed);
  const int n = static_cast<int>(tokens.size());
  std::vector<Tokens> ranks;
  for (int64_t t : tokens) ranks.push_back(MakeTokens(g, t));
  const Experts ex = MakeExperts(g, dt);
  const std::vector<float> want = OneDevice(ranks, ex);
  const auto group = MakeLocalGroup(n);
  std::vector<std::string> errors(n);
  std::vector<int64_t> copies(n);
  std::vector<std::vector<int64_t>> computed(n);  // rows per expert each rank computed
  std::vector<int64_t> outside_bytes(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CpuBackendOptions o;
      o.num_threads = 1;
      CpuBackend b(o);
      ExpertDispatch d(&b, group->rank(r), holders, {kHidden, kInter, kExperts, kTopK}, domain);
      d.set_bf16_rows(dt == DType::kBF16);
      ExpertDispatchStats stats;
      const int64_t before = b.copies_to_host();
      const absl::Status s = d.Run(0, ranks[r].xn.data(), ranks[r].ids.data(), ranks[r].w.data(), ranks[r].t, ex.w13,
                                   ex.w2, ranks[r].x.data(), &stats);
      copies[r] = b.copies_to_host() - before;
      computed[r] = stats.expert_rows;
      outside_bytes[r] = stats.comm_bytes_outside;
      if (!s.ok()) errors[r] = std::string(s.message());
    });
  }
  for (auto& t : threads) t.join();
  const std::string name = ::testing::PrintToString(tokens) + " " + placement + " " +
                           std::string(DTypeShortName(dt)) + " domains of " + std::to_string(domain) + " (seed " +
                           std::to_string(seed) + ")";
  int64_t outside_rows = 0;
  const std::vector<std::vector<int64_t>> want_rows = RowsByRule(ranks, holders, domain, &outside_rows);
  // Each row out of its domain crosses twice: out on the wire's dtype, its result back in fp32;
  // and each rank sends every peer in another domain a count per expert of the busiest rank.
  const int64_t wire = dt == DType::kBF16 ? 2 : 4;
  size_t most = 0;
  for (int r = 0; r < n; ++r) {
    size_t held = 0;
    for (const auto& h : holders[0]) held += std::count(h.begin(), h.end(), r);
    most = std::max(most, held);
  }
  const int64_t counts = domain > 0 && domain < n ? n * (n - domain) * static_cast<int64_t>(most) * 8 : 0;
  EXPECT_EQ(std::accumulate(outside_bytes.begin(), outside_bytes.end(), int64_t{0}),
            domain > 0 ? counts + outside_rows * kHidden * (wire + 4) : 0)
      << name << ": bytes across domains";
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << name << " rank " << r;
    EXPECT_EQ(computed[r], want_rows[r]) << name << " rank " << r << ": rows per expert";
    EXPECT_EQ(copies[r], ranks[r].t > 0 ? 1 : 0) << name << " rank " << r << ": copies to the host in one layer";
    for (size_t i = 0; i < ranks[r].x.size(); ++i, ++at) {
      EXPECT_EQ(ranks[r].x[i], want[at]) << name << " rank " << r << " value " << i;
      if (ranks[r].x[i] != want[at]) return outside_rows;
    }
  }
  return outside_rows;
}

void CheckLayout(const std::vector<int64_t>& tokens, ExpertPlacement placement, DType dt, uint32_t seed) {
  CheckLayout(tokens, ExpertHolders(1, kExperts, static_cast<int64_t>(tokens.size()), placement),
              placement == ExpertPlacement::kRoundRobin ? "round-robin" : "contiguous", dt, seed);
}

TEST(ExpertDispatchTest, EqualsOneDeviceAndCopiesOnlyCountsToTheHost) {
  const uint32_t seed = std::random_device{}();
  for (ExpertPlacement placement : {ExpertPlacement::kContiguous, ExpertPlacement::kRoundRobin}) {
    for (const std::vector<int64_t>& tokens : std::vector<std::vector<int64_t>>{{5, 3}, {4, 0}, {1, 7, 2}, {0, 0}}) {
      CheckLayout(tokens, placement, DType::kF32, seed);
    }
  }
}

// Experts held by several ranks (--expert-replicas): each sender cuts an expert's rows into runs
// for its copies as the rule says (the rows each rank computes), every row is computed once, and
// the result is one device's, bit for bit.
TEST(ExpertDispatchTest, ReplicatedExpertsEqualOneDevice) {
  const uint32_t seed = std::random_device{}();
  using L = std::vector<std::vector<int32_t>>;
  // Copies as the balanced placement makes them from a skewed load (the hot experts on several
  // ranks), and a hand-made table (experts 0 and 1 on both ranks).
  const ExpertLoad load{1, kExperts, {900, 500, 10, 20, 30, 40, 50, 60}};
  for (const std::vector<int64_t>& tokens : std::vector<std::vector<int64_t>>{{5, 3}, {1, 7, 2}, {9, 0}, {0, 0}, {1, 1, 1, 1}}) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    // The fewest and the most copies --expert-replicas takes for n ranks.
    std::vector<int64_t> valid;
    for (int64_t r = 1; r <= kExperts * (n - 1); ++r) {
      if ((kExperts + r) % n == 0) valid.push_back(r);
    }
    ASSERT_FALSE(valid.empty()) << n << " ranks";
    for (int64_t replicas : {valid.front(), valid.back()}) {
      CheckLayout(tokens, ExpertHolders(1, kExperts, n, ExpertPlacement::kBalanced, &load, replicas),
                  "balanced +" + std::to_string(replicas) + " replicas", DType::kF32, seed);
    }
  }
  CheckLayout({4, 6}, ExpertHolderTable{L{{0, 1}, {0, 1}, {0}, {0}, {0}, {1}, {1}, {1}}}, "hand-made copies",
              DType::kF32, seed);
}

// With scale-up domains, a sender's rows of a copied expert go to the copy in its own domain
// where it has one: the placement spreads copies over domains, so the hottest experts' rows
// stay inside; the rows each rank computes and the bytes that cross follow the rule, and the
// result is one device's, bit for bit.
TEST(ExpertDispatchTest, CopiesInTheSendersDomainAreUsed) {
  const uint32_t seed = std::random_device{}();
  const ExpertLoad load{1, kExperts, {900, 500, 10, 20, 30, 40, 50, 60}};
  for (const std::vector<int64_t>& tokens : std::vector<std::vector<int64_t>>{{5, 3, 4, 6}, {1, 0, 2, 7}, {0, 0, 9, 1}}) {
    for (int64_t domain : {1, 2}) {
      for (int64_t replicas : {4, 8}) {  // 8 at 2 domains: every expert in both, nothing crosses
        const ExpertHolderTable holders = ExpertHolders(1, kExperts, 4, ExpertPlacement::kBalanced, &load, replicas, domain);
        const int64_t out = CheckLayout(tokens, holders, "balanced +" + std::to_string(replicas) + " replicas",
                                        DType::kF32, seed, domain);
        if (domain == 2 && replicas == 8) EXPECT_EQ(out, 0) << "every expert in both domains: no row leaves";
      }
    }
  }
  using L = std::vector<std::vector<int32_t>>;
  // Two copies in one domain and none in the other: domain 1's senders split over both.
  CheckLayout({4, 6, 5, 3}, ExpertHolderTable{L{{0, 1}, {0, 2}, {1, 3}, {0}, {1}, {2}, {3}, {2, 3}}}, "hand-made copies",
              DType::kF32, seed, 2);
}

// The bf16 wire, where the experts' GEMMs round their rows to bf16 anyway (the same bits).
TEST(ExpertDispatchTest, TheBf16WireEqualsOneDevice) {
  if (!CpuBackend().RoundsActivationsToBf16(DType::kBF16)) {
    GTEST_SKIP() << "this CPU's kernels do not round activations to bf16 (cpuid: no avx512_bf16 or amx_bf16)";
  }
  const uint32_t seed = std::random_device{}();
  for (ExpertPlacement placement : {ExpertPlacement::kContiguous, ExpertPlacement::kRoundRobin}) {
    CheckLayout({6, 2, 3}, placement, DType::kBF16, seed);
  }
  const ExpertLoad load{1, kExperts, {900, 500, 10, 20, 30, 40, 50, 60}};
  CheckLayout({6, 2, 3, 5}, ExpertHolders(1, kExperts, 4, ExpertPlacement::kBalanced, &load, 4, 2), "balanced +4 replicas",
              DType::kBF16, seed, 2);
}

}  // namespace
}  // namespace moeserve
