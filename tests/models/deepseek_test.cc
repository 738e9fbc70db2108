// DeepSeek-V2/V3 and GLM-4.5 beyond the family test's match with transformers: the real
// DeepSeek-V3 config (parameter counts, KV bytes, FP8 bytes), what is refused, and mutations of
// the tiny checkpoints (correction bias, YaRN's mscale, group count, rotary pair order, partial
// RoPE) that must each break the match, so that the match is not an accident of a part that does
// nothing; multi-token-prediction tensors skipped, others refused.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "roofline/cost_model.h"
#include "tests/models/checkpoint_test_util.h"

namespace moeserve {
namespace {

using checkpoint_test::Fixture;
using checkpoint_test::LogitError;
using checkpoint_test::PatchedSource;
using checkpoint_test::ReadJson;

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

// Kimi-K2 ships DeepSeek-V3's architecture under model_type kimi_k2; a YaRN block without a
// factor takes max_position_embeddings / original_max_position_embeddings.
TEST(DeepseekConfigTest, KimiK2AndADerivedYarnFactor) {
  nlohmann::json j = ReadJson(Fixture("deepseek/deepseek-v3-config.json"));
  j["model_type"] = "kimi_k2";
  j["n_routed_experts"] = 384;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_attention_heads"] = 64;
  j["rope_scaling"].erase("factor");
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 163840.0 / 4096.0);
  j["model_type"] = "kimi_k3";
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
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