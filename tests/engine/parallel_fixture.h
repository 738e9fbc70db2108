// The parallel tests' shared pieces (parallel_test.cc, parallel_layout_test.cc): layouts, CPU
// rank backends, a random prefill step, the model shapes, and the fixture with the one-rank
// oracle.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "core/status.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace moeserve::parallel_test {

struct Layout {
  int64_t ep, pp;
  ExpertPlacement placement = ExpertPlacement::kContiguous;
  int64_t micro = 0;
  int64_t replicas = 0;  // --expert-replicas, with a balanced placement
  int64_t domain = 0;    // --domain-size
};

inline std::string Name(const Layout& l) {
  return absl::StrCat("ep", l.ep, " pp", l.pp,
                      l.placement == ExpertPlacement::kRoundRobin ? " rr"
                      : l.placement == ExpertPlacement::kBalanced ? " balanced"
                                                                  : "",
                      l.micro ? absl::StrCat(" micro", l.micro) : "",
                      l.replicas ? absl::StrCat(" +", l.replicas, " replicas") : "",
                      l.domain ? absl::StrCat(" domains of ", l.domain) : "");
}

inline BackendFactory CpuRanks() {
  return [](int, int) -> std::unique_ptr<Backend> {
    CpuBackendOptions o;
    o.num_threads = 1;
    return std::make_unique<CpuBackend>(o);
  };
}

// The engine over ec.parallel's ranks, each a backend from `ranks`, made as the launch makes
// them (tools/launch.cc MakeRanks); one rank: the engine's own device.
inline absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const EngineConfig& ec, const ModelWeights* weights,
                                                          Backend* backend, const BackendFactory& ranks = CpuRanks()) {
  std::unique_ptr<ParallelExecutor> x;
  if (ec.parallel.enabled()) {
    ASSIGN_OR_RETURN(const KvLayout kv, Engine::CacheLayout(ec, weights->config()));
    ASSIGN_OR_RETURN(x, ParallelExecutor::Create(ec.parallel, weights, backend, kv, ranks));
  }
  return Engine::Create(ec, weights, backend, std::move(x));
}

// --expert-replicas for ep ranks: ep copies or more, the experts plus copies a multiple of ep.
inline int64_t FewestCopies(int64_t experts, int64_t ep) { return ep + (ep - experts % ep) % ep; }

// With a balanced placement, a recorded load of random counts for `c`, so that every layer
// places its experts differently (and not in rank order).
inline ParallelConfig ToConfig(const Layout& l, const ModelConfig* c = nullptr) {
  ParallelConfig p;
  p.ep = l.ep;
  p.pp = l.pp;
  p.placement = l.placement;
  p.micro_batches = l.micro;
  p.expert_replicas = l.replicas;
  p.domain_size = l.domain;
  if (l.placement == ExpertPlacement::kBalanced && c != nullptr) {
    auto load = std::make_shared<ExpertLoad>(ExpertLoad{c->num_hidden_layers, c->num_local_experts, {}});
    std::mt19937 gen(static_cast<uint32_t>(17 * l.ep + l.pp));
    for (int64_t i = 0; i < load->layers * load->experts; ++i) load->tokens.push_back(gen() % 1000);
    p.expert_load = std::move(load);
  }
  return p;
}

// A step of prefills, sequence j (id j) of lens[j] tokens, with its blocks inside the pool
// segment of its EP rank (j mod ep) as the engine's scheduler allocates them, and logit rows at
// each sequence's last token (and a third-to-last one when it has more than 3).
inline ForwardInput MakeStep(const ModelConfig& c, int64_t num_blocks, int64_t block, int64_t ep,
                             const std::vector<int64_t>& lens, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> next(ep);
  for (int64_t e = 0; e < ep; ++e) next[e] = e * (num_blocks / ep);
  ForwardInput in;
  in.num_seqs = static_cast<int64_t>(lens.size());
  for (int64_t len : lens)
    in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, (len + block - 1) / block);
  for (int64_t j = 0; j < in.num_seqs; ++j) {
    const int64_t len = lens[j], need = (len + block - 1) / block;
    const int64_t base = next[j % ep];
    next[j % ep] += need;
    for (int64_t b = 0; b < in.max_blocks_per_seq; ++b)
      in.block_tables.push_back(b < need ? static_cast<int32_t>(base + b) : 0);
    for (int64_t p = 0; p < len; ++p) {
      in.token_ids.push_back(static_cast<int32_t>(gen() % c.vocab_size));
      in.positions.push_back(static_cast<int32_t>(p));
      in.token_seq.push_back(static_cast<int32_t>(j));
      in.slots.push_back((base + p / block) * block + p % block);
    }
    if (len > 3) in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 3));
    in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
  }
  return in;
}

// A model with 3 layers (uneven over 2 stages), 8 experts and a shared expert.
inline ModelConfig WideConfig() {
  ModelConfig c = *PresetConfig("tiny");
  c.num_hidden_layers = 3;
  c.num_local_experts = 8;
  c.shared_expert_intermediate_size = 32;
  return c;
}

// The other families' attention extras on the wide shape: Qwen2-MoE's q/k/v biases (with its
// shared expert, and layer 1 a dense MLP: mlp_only_layers), Qwen3-MoE's per-head q/k norms with a head_dim of its own, OLMoE's
// whole-projection q/k norms.
inline ModelConfig FamilyConfig(ModelFamily family) {
  ModelConfig c = WideConfig();
  c.family = family;
  c.norm_topk_prob = false;
  if (family == ModelFamily::kQwen2Moe) {  // and a dense MLP layer between MoE layers
    c.qkv_bias = true;
    c.mlp_only_layers = {1};
    c.dense_intermediate_size = 80;
  }
  if (family == ModelFamily::kQwen3Moe) {
    c.shared_expert_intermediate_size = 0;
    c.qk_norm = QkNorm::kPerHead;
    c.head_dim = 24;
  }
  if (family == ModelFamily::kOlmoe) {
    c.shared_expert_intermediate_size = 0;
    c.qk_norm = QkNorm::kWhole;
  }
  return c;
}

// DeepSeek on the wide shape: multi-head latent attention (with query compression and YaRN for
// V3, without either for V2), a dense first layer, an ungated shared expert, and V3's grouped
// sigmoid routing with a correction bias or V2's greedy softmax.
inline ModelConfig DeepseekConfig(bool v3) {
  ModelConfig c = WideConfig();
  c.family = v3 ? ModelFamily::kDeepseekV3 : ModelFamily::kDeepseekV2;
  c.mla = MlaConfig{v3 ? 24 : 0, 32, 16, 8, 16, true};
  c.head_dim = c.mla.qk_rope_head_dim;
  c.intermediate_size = 32;
  c.shared_expert_intermediate_size = v3 ? 32 : 64;
  c.shared_expert_gated = false;
  c.first_k_dense_replace = 1;
  c.dense_intermediate_size = 96;
  c.norm_topk_prob = v3;
  if (v3) {
    c.router = RouterConfig{RouterScoring::kSigmoid, GroupLimit::kTopTwoSum, 4, 2, 2.5, true};
    c.rope_scaling = RopeScaling{true, 4.0, 64, 32, 1, 1.0, 1.0, 0, true};
  }
  return c;
}

// GLM-4.5 on the wide shape: q/k/v biases, per-head q/k norms, RoPE on half of each head, and
// DeepSeek-V3's MoE (a dense first layer, grouped sigmoid routing with a correction bias).
inline ModelConfig GlmConfig() {
  ModelConfig c = DeepseekConfig(true);
  c.family = ModelFamily::kGlm4Moe;
  c.mla = MlaConfig{0, 0, 0, 0, 0, true};
  c.rope_scaling = RopeScaling();
  c.head_dim = 24;
  c.num_key_value_heads = 2;
  c.qkv_bias = true;
  c.qk_norm = QkNorm::kPerHead;
  c.partial_rotary_factor = 0.5;
  return c;
}

const char* const kModelNames[] = {"Tiny",       "Wide",       "Qwen2Moe", "Qwen3Moe",     "Olmoe",
                                   "DeepseekV3", "DeepseekV2", "Glm4Moe",  "DeepseekV3Fp8"};

// How the weights are stored: bf16, and FP8 (quantized at load) for the last model.
inline DType StorageFor(int i) { return i == 8 ? DType::kF8E4M3 : DType::kBF16; }

inline ModelConfig ModelFor(int i) {
  switch (i) {
    case 0:
      return *PresetConfig("tiny");
    case 1:
      return WideConfig();
    case 2:
      return FamilyConfig(ModelFamily::kQwen2Moe);
    case 3:
      return FamilyConfig(ModelFamily::kQwen3Moe);
    case 4:
      return FamilyConfig(ModelFamily::kOlmoe);
    case 5:
    case 6:
      return DeepseekConfig(i == 5);
    case 7:
      return GlmConfig();
    default:
      return DeepseekConfig(true);
  }
}

// Logits of the same rows by the same kernels in the same order: equal up to float rounding
// (in practice bit for bit).
inline void ExpectLogitsClose(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i]) && std::isfinite(want[i])) << what << " logit " << i;
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_LE(max_abs, 1e-5 * std::max(1.0, max_ref)) << what << ": max-abs " << max_abs << ", relative "
                                                     << max_abs / std::max(1e-30, max_ref);
}

class ParallelTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    config_ = ModelFor(GetParam());
    // PARALLEL_TEST_SEED replays a failing run's seed (printed in the failure messages).
    const char* fixed = std::getenv("PARALLEL_TEST_SEED");
    seed_ = fixed != nullptr ? static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10)) : std::random_device{}();
    storage_ = StorageFor(GetParam());
    weights_ = *ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32),
                                   &backend_, storage_);
  }
  // The oracle: the single-rank forward of the same step on a cache of `layout`.
  // One rank's logits for `in`, and (with `stats`) its routing per (layer, expert).
  std::vector<float> OneRankLogits(const ForwardInput& in, const KvLayout& layout, ForwardStats* stats = nullptr) {
    auto kv = KvStorage::Create(&backend_, layout);
    std::vector<float> logits;
    MoeModel one(weights_.get(), &backend_);
    if (!kv.ok() || !one.Forward(in, layout, kv->data(), &logits, stats).ok()) logits.clear();
    return logits;
  }
  // The same for two steps in turn on one cache (the second attends to the first's KV).
  bool OneRankTwoSteps(const ForwardInput& first, const ForwardInput& second, const KvLayout& layout,
                       std::vector<float>* want1, std::vector<float>* want2) {
    auto kv = KvStorage::Create(&backend_, layout);
    MoeModel one(weights_.get(), &backend_);
    return kv.ok() && one.Forward(first, layout, kv->data(), want1).ok() &&
           one.Forward(second, layout, kv->data(), want2).ok();
  }
  CpuBackend backend_;
  ModelConfig config_;
  DType storage_ = DType::kBF16;
  uint32_t seed_ = 0;
  std::unique_ptr<ModelWeights> weights_;
};

}  // namespace moeserve::parallel_test
