// kernels/cuda: every op of the CUDA backend against the CPU reference on the same fresh random
// inputs (max-abs and relative error in each message), and the whole engine's greedy output on
// the GPU against the CPU backend's. Skipped when no GPU is visible.
//
// Tolerances: ops in fp32 agree to 1e-4 relative (different summation order); GEMMs with bf16
// weights round the activations to bf16 on the GPU (the CPU keeps them in fp32), which bounds
// the relative error by about 2^-8 per product: 2e-2 of the output's scale.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/sample_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#include "models/weight_init.h"
#include "tests/kernels/op_cases.h"

namespace moeserve {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::ListDevices().empty()) GTEST_SKIP() << "no GPU visible";
    auto b = CudaBackend::Create({});
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    seed_ = std::random_device{}();
    gen_.seed(seed_);
  }

  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen_);
    return v;
  }
  // A device copy of host data (kept alive by the test).
  template <typename T>
  T* Up(const std::vector<T>& v) {
    auto buf = gpu_->Allocate(std::max<size_t>(v.size() * sizeof(T), 1));
    if (!buf.ok()) {
      ADD_FAILURE() << buf.status();
      return nullptr;
    }
    EXPECT_TRUE(gpu_->CopyToDevice(buf->data(), v.data(), v.size() * sizeof(T)).ok());
    T* p = static_cast<T*>(buf->data());
    keep_.push_back(std::move(*buf));
    return p;
  }
  template <typename T>
  std::vector<T> Down(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(gpu_->Synchronize().ok());
    EXPECT_TRUE(gpu_->CopyToHost(v.data(), p, n * sizeof(T)).ok());
    return v;
  }
  // Max-abs error against the reference, relative to the reference's largest magnitude.
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                          const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double max_abs = 0, scale = 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    EXPECT_LE(max_abs / scale, rel) << what << ": max-abs " << max_abs << ", relative " << max_abs / scale;
  }

  CpuBackend cpu_{CpuBackendOptions{CpuPath::kReference}};
  std::unique_ptr<CudaBackend> gpu_;
  std::vector<DeviceBuffer> keep_;
  std::mt19937 gen_;
  uint32_t seed_ = 0;
};

// Every op case of tests/kernels/op_cases.h (norms, elementwise, RoPE, routing, gather and
// combine, bf16 conversions, embedding, KV writes, GEMMs, routing planned on the device and the
// grouped GEMM it feeds, paged attention over f32 and bf16 caches, logit edits, greedy and top-1
// sampling) on the GPU against the CPU reference with the same inputs: the max-abs error
// relative to the reference's largest magnitude within 10x the case's rtol (the GPU's exp,
// rsqrt, sin and cos differ from libm's in the last bits, and it rounds bf16-weight GEMM
// activations to bf16), and exact where the case asks for it.
TEST_F(CudaBackendTest, EveryOpCaseMatchesTheReference) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (const testing::OpCase& c : testing::OpCases()) {
    std::mt19937 g1(seed_), g2(seed_);
    const std::vector<double> want = c.run(cpu_, g1), got = c.run(*gpu_, g2);
    ASSERT_EQ(got.size(), want.size()) << c.name;
    double max_abs = 0, scale = 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << c.name << " element " << i;
      max_abs = std::max(max_abs, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    EXPECT_LE(max_abs, c.atol + 10 * c.rtol * scale) << c.name << ": max-abs " << max_abs << ", relative "
                                                     << max_abs / scale;
  }
}

// Sampling on the GPU against the host rule (sorting) on the same rows and uniform draws: vocab
// sizes past one block's threads, ties, every top-k/top-p/temperature regime. The GPU sums
// probabilities in another order, so a draw within 1e-9 of a boundary may land on a neighbour:
// such rows are counted and must be rare; every other row must match.
TEST_F(CudaBackendTest, SampleRowsPicksWhatTheHostSamplerPicks) {
  const int64_t rows = 256, vocab = 3001;
  std::vector<float> logits(rows * vocab);
  std::vector<SampleSpec> specs(rows);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::normal_distribution<float> normal(0.0f, r % 3 == 0 ? 6.0f : 1.5f);
    for (int64_t i = 0; i < vocab; ++i) {
      const float x = normal(gen_);
      logits[r * vocab + i] = r % 2 ? x : static_cast<float>(static_cast<int>(x * 2)) / 2;  // ties on even rows
    }
    const float temps[] = {0.0f, 0.1f, 0.8f, 2.0f};
    const int32_t ks[] = {0, 1, 40, static_cast<int32_t>(vocab)};
    const float ps[] = {1.0f, 0.9f, 0.3f};
    specs[r].temperature = temps[r % 4];
    specs[r].top_k = ks[(r / 4) % 4];
    specs[r].top_p = ps[(r / 16) % 3];
    const float min_ps[] = {0.0f, 0.1f};
    specs[r].min_p = min_ps[(r / 48) % 2];
    specs[r].u = unit(gen_);
  }
  auto dtok = gpu_->Allocate(rows * sizeof(int32_t));
  ASSERT_TRUE(dtok.ok());
  gpu_->SampleRows(Up(logits), rows, vocab, Up(specs), dtok->as<int32_t>());
  const auto got = Down(dtok->as<int32_t>(), rows);
  int off_by_rounding = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t want = cpu_sample::SortSampleRow(logits.data() + r * vocab, vocab, specs[r]);
    if (got[r] == want) continue;
    // Accept only a draw sitting on a boundary: nudging u by 1e-9 must reach the GPU's pick.
    SampleSpec lo = specs[r], hi = specs[r];
    lo.u = std::max(0.0, lo.u - 1e-9);
    hi.u = std::min(1.0 - 1e-12, hi.u + 1e-9);
    const bool boundary = cpu_sample::SortSampleRow(logits.data() + r * vocab, vocab, lo) == got[r] ||
                          cpu_sample::SortSampleRow(logits.data() + r * vocab, vocab, hi) == got[r];
    EXPECT_TRUE(boundary) << "row " << r << " (temperature " << specs[r].temperature << ", top_k " << specs[r].top_k
                          << ", top_p " << specs[r].top_p << ", min_p " << specs[r].min_p << ", u " << specs[r].u << "): GPU " << got[r] << ", host "
                          << want << ", seed " << seed_;
    ++off_by_rounding;
  }
  EXPECT_LE(off_by_rounding, 2) << "seed " << seed_;
}

// The bf16 wire's conversions: bit for bit the CPU backend's, NaNs, infinities, ties and
// subnormals included, and back.
TEST_F(CudaBackendTest, Bf16ConversionsEqualTheCpuBackend) {
  std::vector<float> x = Random(100003, 1000.0f);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 1.00390625f /* a tie */, 1e-40f, -0.0f};
  for (size_t i = 0; i < std::size(special); ++i) x[i] = special[i];
  std::vector<uint16_t> want(x.size());
  cpu_.RoundToBf16(x.data(), static_cast<int64_t>(x.size()), want.data());
  std::vector<uint16_t> out(x.size());
  uint16_t* d = Up(out);
  gpu_->RoundToBf16(Up(x), static_cast<int64_t>(x.size()), d);
  EXPECT_EQ(Down(d, x.size()), want);
  std::vector<float> wide(x.size()), wide_want(x.size());
  cpu_.WidenBf16(want.data(), static_cast<int64_t>(x.size()), wide_want.data());
  float* w = Up(wide);
  gpu_->WidenBf16(Up(want), static_cast<int64_t>(x.size()), w);
  const std::vector<float> got = Down(w, x.size());
  EXPECT_EQ(0, std::memcmp(got.data(), wide_want.data(), got.size() * sizeof(float)));
}

// Pinned host memory and the copy stream: a copy sees what compute enqueued before it wrote,
// compute enqueued after OrderComputeAfterCopies sees what a copy wrote, and WaitCopy makes a
// device-to-host copy visible to the host; more copies than the ticket ring holds.
TEST_F(CudaBackendTest, PinnedCopiesOnTheCopyStreamAreOrderedAgainstCompute) {
  const int64_t n = 1 << 16;
  auto host = gpu_->AllocateHost(n * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(host->pinned());
  const auto a = Random(n), b = Random(n);
  float* da = Up(a);
  float* db = Up(b);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  gpu_->Add(da, db, n);  // compute: a += b, then the copy must see it
  auto t = gpu_->CopyAsync(host->data(), da, n * sizeof(float));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(gpu_->WaitCopy(*t).ok());
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  std::vector<float> got(n);
  std::memcpy(got.data(), host->data(), n * sizeof(float));
  ExpectClose(got, want, 0, "device to pinned host after compute");
  // Host to device (a again), then compute ordered after the copy: b += a.
  for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(host->data())[i] = a[i];
  auto t2 = gpu_->CopyAsync(da, host->data(), n * sizeof(float));
  ASSERT_TRUE(t2.ok());
  gpu_->OrderComputeAfterCopies();
  gpu_->Add(db, da, n);
  for (int64_t i = 0; i < n; ++i) want[i] = b[i] + a[i];
  ExpectClose(Down(db, n), want, 0, "compute after an ordered host-to-device copy");
  // Many small copies (past the ring of tickets), each waited for in turn at the end.
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 200; ++i) {
    auto ti = gpu_->CopyAsync(host->data() + (i % 64) * 64, da + (i % 64) * 16, 64);
    ASSERT_TRUE(ti.ok()) << ti.status();
    tickets.push_back(*ti);
  }
  for (uint64_t ti : tickets) ASSERT_TRUE(gpu_->WaitCopy(ti).ok());
  EXPECT_FALSE(gpu_->WaitCopy(tickets.back() + 1).ok());
}

// The whole engine on the GPU against the CPU backend: greedy tokens equal, or the first
// divergence is a near-tie of the CPU's top two log-probabilities. f32 weights, so that both
// sides multiply in fp32 (with bf16 weights the GPU rounds activations to bf16 and a flipped
// expert choice would be expected now and then; the op test covers bf16).
TEST_F(CudaBackendTest, EngineGreedyOutputMatchesTheCpuBackend) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const ModelConfig config = *PresetConfig("tiny");
  auto tensors = GenerateRandomWeights(config, gen_(), DType::kF32);
  CpuBackend cpu;
  auto cpu_weights = ModelWeights::Load(config, *tensors, &cpu, DType::kF32);
  auto gpu_weights = ModelWeights::Load(config, *tensors, gpu_.get(), DType::kF32);
  ASSERT_TRUE(cpu_weights.ok() && gpu_weights.ok());
  std::vector<GenerateRequest> reqs(8);
  for (auto& r : reqs) {
    for (int i = 0, n = 1 + static_cast<int>(gen_() % 40); i < n; ++i) r.prompt.push_back(gen_() % 256);
    r.max_tokens = 16;
    r.top_logprobs = 2;
  }
  reqs[1].sampling.repetition_penalty = 1.4f;  // logit edits on the device
  reqs[1].sampling.frequency_penalty = 0.5f;
  reqs[2].sampling.logit_bias = {{7, 5.0f}, {9, -5.0f}};
  reqs[2].stop_ids = {7};
  reqs[2].min_tokens = 8;
  auto run = [&](const ModelWeights* w, Backend* b) {
    EngineConfig ec;
    ec.num_kv_blocks = 128;
    auto e = Engine::Create(ec, w, b);
    std::vector<std::pair<std::vector<int32_t>, std::vector<std::vector<TokenLogprob>>>> res;
    if (!e.ok()) {
      ADD_FAILURE() << e.status();
      return res;
    }
    std::mutex mu;
    std::map<uint64_t, std::pair<std::vector<int32_t>, std::vector<std::vector<TokenLogprob>>>> out;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {
      auto id = (*e)->Submit(r, [&](const RequestEvent& ev) {
        std::lock_guard<std::mutex> lock(mu);
        auto& o = out[ev.request_id];
        o.first.insert(o.first.end(), ev.tokens.begin(), ev.tokens.end());
        o.second.insert(o.second.end(), ev.logprobs.begin(), ev.logprobs.end());
      });
      if (!id.ok()) {
        ADD_FAILURE() << id.status();
        return res;
      }
      ids.push_back(*id);
    }
    EXPECT_TRUE((*e)->RunUntilIdle().ok());
    for (uint64_t id : ids) res.push_back(out[id]);
    return res;
  };
  const auto want = run(cpu_weights->get(), &cpu);
  const auto got = run(gpu_weights->get(), gpu_.get());
  ASSERT_EQ(want.size(), reqs.size());
  ASSERT_EQ(got.size(), reqs.size());
  int identical = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& a = want[i].first;
    const auto& b = got[i].first;
    size_t d = 0;
    while (d < a.size() && d < b.size() && a[d] == b[d]) ++d;
    if (d == a.size() && d == b.size()) {
      ++identical;
      continue;
    }
    ASSERT_LT(d, want[i].second.size());
    const auto& top = want[i].second[d];
    ASSERT_GE(top.size(), 2u);
    EXPECT_EQ(b[d], top[1].token) << "request " << i << " diverges at " << d << " beyond the CPU's top two";
    EXPECT_LT(top[0].logprob - top[1].logprob, 0.05) << "request " << i << " diverges at " << d
                                                     << " where the CPU's top two are not a near-tie";
  }
  std::printf("GPU vs CPU greedy: %d of %zu requests identical\n", identical, reqs.size());
}

}  // namespace
}  // namespace moeserve
