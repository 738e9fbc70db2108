// DeepSeek-V2/V3 beyond the family test's match with transformers: the real DeepSeek-V3 config
// (parameter counts, KV bytes), what is refused, and mutations of the tiny V3 checkpoint
// (correction bias, YaRN's mscale, group count, rotary pair order) that must each break the
// match, so that the match is not an accident of a part that does nothing.
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"
#include "models/host_matrix.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "roofline/cost_model.h"

namespace moeserve {
namespace {

std::string Fixture(const std::string& rel) { return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/" + rel; }

nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

// A checkpoint with some tensors replaced or added.
class PatchedSource : public TensorSource {
 public:
  explicit PatchedSource(const TensorSource& base) : base_(base) {}
  void Set(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    SetRaw(name, std::move(shape), DType::kF32, std::move(bytes));
  }
  void SetRaw(const std::string& name, std::vector<int64_t> shape, DType dtype, std::vector<uint8_t> bytes) {
    values_[name] = std::move(bytes);
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.data = values_[name].data();
    v.bytes = values_[name].size();
    views_[name] = v;
  }
  void Remove(const std::string& name) { removed_.insert(name); }
  const TensorView* Find(const std::string& name) const override {
    if (removed_.count(name) > 0) return nullptr;
    auto it = views_.find(name);
    return it != views_.end() ? &it->second : base_.Find(name);
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const std::string& n : base_.Names()) {
      if (removed_.count(n) == 0) names.push_back(n);
    }
    for (const auto& [n, v] : views_) {
      if (base_.Find(n) == nullptr) names.push_back(n);
    }
    return names;
  }

 private:
  const TensorSource& base_;
  std::map<std::string, std::vector<uint8_t>> values_;
  std::map<std::string, TensorView> views_;
  std::set<std::string> removed_;
};

// One prefill of `ids` (logits at every position).
std::vector<float> PrefillLogits(const ModelConfig& config, const ModelWeights& weights, Backend* backend,
                                 const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), block = 16;
  auto kv = KvStorage::Create(backend, KvLayoutFor(config, 4, block, DType::kF32));
  EXPECT_TRUE(kv.ok());
  MoeModel model(&weights, backend);
  ForwardInput in;
  in.token_ids = ids;
  in.num_seqs = 1;
  in.max_blocks_per_seq = (n + block - 1) / block;
  for (int64_t i = 0; i < n; ++i) {
    in.positions.push_back(static_cast<int32_t>(i));
    in.token_seq.push_back(0);
    in.slots.push_back(i);
    in.logit_rows.push_back(static_cast<int32_t>(i));
  }
  for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) in.block_tables.push_back(static_cast<int32_t>(b));
  std::vector<float> logits;
  EXPECT_TRUE(model.Forward(in, kv->layout(), kv->data(), &logits).ok());
  return logits;
}

// Max-abs error of the first fixture prompt's logits (every position, one prefill) against
// transformers', with `config` in place of the checkpoint's; with `against`, the error of that
// model's logits against this one's instead.
double LogitError(const ModelConfig& config, const TensorSource& source, const std::string& dir,
                  DType storage = DType::kF32, const std::unique_ptr<ModelWeights>* against = nullptr) {
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference, 1, 0});
  auto weights = ModelWeights::Load(config, source, &backend, storage);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return INFINITY;
  const nlohmann::json expected = ReadJson(dir + "/expected.json");
  const auto ids = expected["cases"][0]["ids"].get<std::vector<int32_t>>();
  const std::vector<float> mine = PrefillLogits(config, **weights, &backend, ids);
  std::vector<float> want(mine.size()), got = mine;
  if (against != nullptr) {
    // Exact numerics: the bf16 variants would round activations for the bf16 lm_head.
    CpuBackend fast(CpuBackendOptions{CpuPath::kFast, 1, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
    want = mine;
    got = PrefillLogits(config, **against, &fast, ids);
  } else {
    std::ifstream f(dir + "/" + expected["cases"][0]["logits"].get<std::string>(), std::ios::binary);
    f.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(float)));
  }
  if (got.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(double{got[i]} - want[i]));
  return err;
}

TEST(DeepseekConfigTest, RealDeepseekV3ConfigPricesTheRealModel) {
  const nlohmann::json j = ReadJson(Fixture("deepseek/deepseek-v3-config.json"));
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp8_checkpoint);
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c->KvElemsPerToken(), 512 + 64);
  EXPECT_EQ(c->first_k_dense_replace, 3);
  EXPECT_EQ(c->router.group_limit, GroupLimit::kTopTwoSum);
  EXPECT_TRUE(c->rope_scaling.yarn);
  // DeepSeek's own figures: 671B parameters, 37B activated per token (the MTP module aside).
  const double total = static_cast<double>(c->TotalParams()), active = static_cast<double>(c->ActiveParams());
  EXPECT_LE(std::fabs(total - 671e9) / 671e9, 0.01) << "TotalParams " << total;
  EXPECT_LE(std::fabs(active - 37e9) / 37e9, 0.03) << "ActiveParams " << active;
  // YaRN factor 40 with mscale_all_dim 1: softmax scale 1/sqrt(192) x (0.1 ln 40 + 1)^2.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale(), m * m / std::sqrt(192.0), 1e-12);
  // The cache holds one 576-value latent per token per layer: 61 x 576 x 2 bytes in bf16.
  EXPECT_STREQ(roofline::WeightDtypeName(*c, DType::kBF16), "fp8");
  const roofline::ModelCosts fp8 = roofline::ModelCosts::From(*c, "fp8", "bf16");
  EXPECT_DOUBLE_EQ(fp8.kv_bytes_per_token, 61.0 * 576 * 2);
  EXPECT_EQ(fp8.moe_layers, 58);
  // FP8 weights: a byte per weight and 4 per 128 of a row (the lm_head stays bf16), about half
  // of bf16's bytes.
  const roofline::ModelCosts bf16 = roofline::ModelCosts::From(*c, "bf16", "bf16");
  EXPECT_DOUBLE_EQ(fp8.weight_bytes_per_param, 1.0 + 4.0 / 128);
  const double ratio = fp8.TotalWeightBytes() / bf16.TotalWeightBytes();
  EXPECT_NEAR(ratio, (1.0 + 4.0 / 128) / 2, 1e-9);
  EXPECT_LT(fp8.DenseBytes(), bf16.DenseBytes() * 0.6);
  // Other quantization methods and FP8 shapes this build does not read are refused by name.
  for (const auto& [q, want] : std::vector<std::pair<nlohmann::json, const char*>>{
           {{{"quant_method", "awq"}}, "quant_method \"awq\""},
           {{{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}, "weight_block_size [64,64]"},
           {{{"quant_method", "fp8"}}, "per-tensor FP8"},
           {{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"fmt", "e5m2"}}, "fmt \"e5m2\""},
           {{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"activation_scheme", "static"}},
            "activation_scheme \"static\""}}) {
    nlohmann::json bad = j;
    bad["quantization_config"] = q;
    auto r = ModelConfig::FromJson(bad.dump());
    ASSERT_FALSE(r.ok()) << q.dump();
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status();
  }
}

TEST(DeepseekConfigTest, WhatIsNotImplementedIsRefusedByName) {
  const nlohmann::json base = ReadJson(Fixture("hf/deepseekv3/config.json"));
  const std::pair<nlohmann::json, const char*> cases[] = {
      {{{"scoring_func", "softmax"}}, "scoring_func \"softmax\" is not supported"},
      {{{"topk_method", "greedy"}}, "topk_method \"greedy\" is not supported"},
      {{{"n_group", 3}}, "\"n_group\" (3) must divide"},
      {{{"topk_group", 5}}, "\"topk_group\" (5) must be in [1, n_group = 4]"},
      {{{"moe_layer_freq", 2}}, "moe_layer_freq 2 is not supported"},
      {{{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}}}, "rope_type \"linear\" is not supported"},
      {{{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                             {"low_freq_factor", 1.0}}}},
       "low_freq_factor 1.0 is not supported"},
      {{{"qk_head_dim", 99}}, "qk_head_dim 99 is not supported"},
      {{{"attention_bias", true}}, "attention_bias true is not supported"},
  };
  for (const auto& [patch, want] : cases) {
    nlohmann::json j = base;
    j.merge_patch(patch);
    auto c = ModelConfig::FromJson(j.dump());
    ASSERT_FALSE(c.ok()) << patch.dump();
    EXPECT_NE(c.status().message().find(want), std::string::npos) << patch.dump() << ": " << c.status();
  }
  nlohmann::json v2 = ReadJson(Fixture("hf/deepseekv2lite/config.json"));
  v2["norm_topk_prob"] = true;
  auto c = ModelConfig::FromJson(v2.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("norm_topk_prob"), std::string::npos) << c.status();
}

TEST(DeepseekConfigTest, ToJsonReadsBackTheSameModel) {
  for (const char* family : {"deepseekv3", "deepseekv2lite", "deepseekv2group"}) {
    auto c = ModelConfig::FromFile(Fixture(std::string("hf/") + family + "/config.json"));
    ASSERT_TRUE(c.ok()) << c.status();
    auto again = ModelConfig::FromJson(c->ToJson());
    ASSERT_TRUE(again.ok()) << family << ": " << again.status() << "\n" << c->ToJson();
    EXPECT_EQ(again->family, c->family);
    EXPECT_EQ(again->mla.q_lora_rank, c->mla.q_lora_rank) << family;
    EXPECT_EQ(again->mla.kv_lora_rank, c->mla.kv_lora_rank);
    EXPECT_EQ(again->router.group_limit, c->router.group_limit);
    EXPECT_EQ(again->router.n_group, c->router.n_group);
    EXPECT_EQ(again->router.routed_scaling_factor, c->router.routed_scaling_factor);
    EXPECT_EQ(again->first_k_dense_replace, c->first_k_dense_replace);
    EXPECT_EQ(again->shared_expert_intermediate_size, c->shared_expert_intermediate_size);
    EXPECT_EQ(again->rope_scaling.yarn, c->rope_scaling.yarn);
    EXPECT_EQ(again->rope_scaling.mscale_all_dim, c->rope_scaling.mscale_all_dim);
    EXPECT_EQ(again->TotalParams(), c->TotalParams());
  }
}

TEST(DeepseekModelTest, EachMutationBreaksTheMatchWithTransformers) {
  const std::string dir = Fixture("hf/deepseekv3");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const double exact = LogitError(*config, **checkpoint, dir);
  EXPECT_LT(exact, 1e-3) << "the unmutated model must match";
  auto expect_broken = [&](const ModelConfig& c, const TensorSource& src, const char* what) {
    const double err = LogitError(c, src, dir);
    EXPECT_GT(err, 100 * std::max(exact, 1e-5)) << what << " changed nothing: max-abs error " << err;
  };
  {
    PatchedSource zero_bias(**checkpoint);
    for (int64_t l = config->first_k_dense_replace; l < config->num_hidden_layers; ++l) {
      zero_bias.Set("model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias",
                    {config->num_local_experts}, std::vector<float>(config->num_local_experts, 0.0f));
    }
    expect_broken(*config, zero_bias, "dropping the correction bias");
  }
  ModelConfig no_mscale = *config;
  no_mscale.rope_scaling.mscale_all_dim = 0;
  expect_broken(no_mscale, **checkpoint, "dropping YaRN's mscale_all_dim");
  ModelConfig groups = *config;
  groups.router.n_group = 2;
  groups.router.topk_group = 1;
  expect_broken(groups, **checkpoint, "a wrong group count");
  ModelConfig halves = *config;
  halves.mla.rope_interleave = false;
  expect_broken(halves, **checkpoint, "rotating halves instead of pairs");
  ModelConfig no_yarn = *config;
  no_yarn.rope_scaling.yarn = false;
  expect_broken(no_yarn, **checkpoint, "plain RoPE frequencies");
}

TEST(DeepseekModelTest, MultiTokenPredictionLayersAreSkippedOthersRefused) {
  const std::string dir = Fixture("hf/deepseekv3");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  ASSERT_EQ(config->num_nextn_predict_layers, 1);
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference, 1, 0});
  {
    PatchedSource mtp(**checkpoint);
    mtp.Set("model.layers.3.eh_proj.weight", {64, 128}, std::vector<float>(64 * 128, 1.0f));
    mtp.Set("model.layers.3.enorm.weight", {64}, std::vector<float>(64, 1.0f));
    auto w = ModelWeights::Load(*config, mtp, &backend, DType::kF32);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->skipped_mtp_tensors(), 2);
  }
  {
    PatchedSource beyond(**checkpoint);
    beyond.Set("model.layers.4.enorm.weight", {64}, std::vector<float>(64, 1.0f));
    auto w = ModelWeights::Load(*config, beyond, &backend, DType::kF32);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("model.layers.4.enorm.weight"), std::string::npos) << w.status();
  }
  {
    PatchedSource bad_shape(**checkpoint);
    bad_shape.Set("model.layers.1.self_attn.kv_b_proj.weight", {64, 32}, std::vector<float>(64 * 32, 0.0f));
    auto w = ModelWeights::Load(*config, bad_shape, &backend, DType::kF32);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("kv_b_proj"), std::string::npos) << w.status();
  }
}

// A damaged FP8 checkpoint is refused at load naming the tensor and the problem.
TEST(DeepseekModelTest, DamagedFp8CheckpointsAreRefusedNamingTheTensor) {
  const std::string dir = Fixture("hf/deepseekv3fp8");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->fp8_checkpoint);
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::string w = "model.layers.1.self_attn.o_proj.weight";
  const TensorView* weight = (*checkpoint)->Find(w);
  const TensorView* scale = (*checkpoint)->Find(w + "_scale_inv");
  ASSERT_TRUE(weight != nullptr && scale != nullptr);
  ASSERT_EQ(weight->dtype, DType::kF8E4M3);
  const std::vector<uint8_t> wbytes(static_cast<const uint8_t*>(weight->data),
                                    static_cast<const uint8_t*>(weight->data) + weight->bytes);
  std::vector<float> scales(static_cast<size_t>(scale->numel()));
  ConvertToF32(scale->data, scale->dtype, scales.size(), scales.data());
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0});
  auto expect_refused = [&](const PatchedSource& src, const std::string& want, const char* what) {
    auto loaded = ModelWeights::Load(*config, src, &backend, DType::kF32);
    ASSERT_FALSE(loaded.ok()) << what;
    EXPECT_NE(loaded.status().message().find(want), std::string::npos) << what << ": " << loaded.status();
  };
  {
    PatchedSource src(**checkpoint);
    src.Remove(w + "_scale_inv");
    expect_refused(src, "\"" + w + "\" is FP8 but the checkpoint has no", "a missing scale");
  }
  {
    PatchedSource src(**checkpoint);
    src.Set(w + "_scale_inv", {1, static_cast<int64_t>(scales.size())}, scales);
    expect_refused(src, w + "_scale_inv\" has shape", "a scale of the wrong shape");
  }
  for (float bad : {0.0f, std::nanf(""), -1.0f}) {
    PatchedSource src(**checkpoint);
    std::vector<float> s2 = scales;
    s2[0] = bad;
    src.Set(w + "_scale_inv", scale->shape, s2);
    expect_refused(src, "must be finite and positive", "a bad scale");
  }
  {
    PatchedSource src(**checkpoint);
    std::vector<uint8_t> nan = wbytes;
    nan[5] = 0x7f;
    src.SetRaw(w, weight->shape, DType::kF8E4M3, nan);
    expect_refused(src, "element 5 is an FP8 NaN", "a NaN weight");
  }
  {
    PatchedSource src(**checkpoint);
    std::vector<float> as_f32(wbytes.size());
    for (size_t i = 0; i < wbytes.size(); ++i) as_f32[i] = F8E4M3ToF32(wbytes[i]);
    src.Set(w, weight->shape, as_f32);
    expect_refused(src, "rather than F8_E4M3", "a scaled tensor of the wrong dtype");
  }
  {
    ModelConfig no_quant = *config;
    no_quant.fp8_checkpoint = false;
    auto loaded = ModelWeights::Load(no_quant, **checkpoint, &backend, DType::kF32);
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find("no quantization_config"), std::string::npos) << loaded.status();
  }
  // The undamaged checkpoint stays FP8 in memory: about a byte per weight of the FP8 tensors.
  auto fp8 = ModelWeights::Load(*config, **checkpoint, &backend, DType::kF32);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ((*fp8)->layer(1).o.dtype, DType::kF8E4M3);
  EXPECT_EQ((*fp8)->layer(1).w13[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*fp8)->embed().dtype, DType::kF32);
}

// --quantization fp8 on an f32 checkpoint computes exactly the model whose weights are the FP8
// values: each linear weight quantized by 128 x 128 blocks as an FP8 checkpoint's writer does
// (before MLA's derivations), the embedding and lm_head kept in bf16. The oracle is the f32
// model loaded from those values.
TEST(DeepseekModelTest, QuantizingAtLoadComputesTheDequantizedModel) {
  const std::string dir = Fixture("hf/deepseekv3");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
  auto w = ModelWeights::Load(*config, **checkpoint, &backend, DType::kF8E4M3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layer(1).q_nope.dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->layer(1).k_up_t[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->layer(1).w13[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->embed().dtype, DType::kBF16);
  PatchedSource dequantized(**checkpoint);
  int64_t quantized = 0;
  for (const std::string& name : (*checkpoint)->Names()) {
    const TensorView* t = (*checkpoint)->Find(name);
    auto m = ReadHostMatrix(*t, nullptr);
    ASSERT_TRUE(m.ok());
    std::vector<float> values = m->values;
    const bool table = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    if (table) {
      for (float& v : values) v = Bf16ToF32(F32ToBf16(v));
    } else if (t->shape.size() == 2 && name.find("mlp.gate.weight") == std::string::npos) {
      const HostMatrix q = QuantizeFp8(*m);
      for (int64_t i = 0; i < q.rows * q.cols; ++i) {
        values[i] = F8E4M3ToF32(q.bytes[i]) * q.scales[(i / q.cols) * q.ScaleGroups() + (i % q.cols) / 128];
      }
      ++quantized;
    }
    dequantized.Set(name, t->shape, values);
  }
  EXPECT_GT(quantized, 20);
  const double err = LogitError(*config, dequantized, dir, DType::kF32, &*w);
  EXPECT_LT(err, 2e-5) << "max-abs logit error " << err;
}

// GLM-4.5 rotates half of each head and routes as DeepSeek-V3: each undone breaks the match.
TEST(DeepseekModelTest, GlmMutationsBreakTheMatchWithTransformers) {
  const std::string dir = Fixture("hf/glm4moe");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rotary_dim(), 12);
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  const double exact = LogitError(*config, **checkpoint, dir);
  EXPECT_LT(exact, 1e-3);
  ModelConfig full = *config;
  full.partial_rotary_factor = 1.0;
  EXPECT_GT(LogitError(full, **checkpoint, dir), 100 * std::max(exact, 1e-5)) << "rotating whole heads changed nothing";
  ModelConfig scale = *config;
  scale.router.routed_scaling_factor = 1.0;
  EXPECT_GT(LogitError(scale, **checkpoint, dir), 100 * std::max(exact, 1e-5)) << "routed_scaling_factor changed nothing";
  auto again = ModelConfig::FromJson(config->ToJson());
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << config->ToJson();
  EXPECT_EQ(again->family, ModelFamily::kGlm4Moe);
  EXPECT_EQ(again->partial_rotary_factor, 0.5);
  EXPECT_EQ(again->qk_norm, QkNorm::kPerHead);
  EXPECT_TRUE(again->qkv_bias);
  EXPECT_EQ(again->router.n_group, config->router.n_group);
  EXPECT_EQ(again->TotalParams(), config->TotalParams());
}

}  // namespace
}  // namespace moeserve