// Each supported Hugging Face family against transformers itself: tiny random checkpoints
// written by transformers' own config classes and save_pretrained (Mixtral, Qwen2-MoE with
// q/k/v biases and a gated shared expert, Qwen3-MoE with per-head q/k norms and head_dim
// independent of hidden_size, OLMoE with whole-projection q/k norms and top-8 of 64, DeepSeek-V3
// and -V2 with multi-head latent attention, YaRN, dense first layers and grouped routing), with the
// logits transformers computed for three prompts and its greedy continuations
// (scripts/make-hf-fixtures.py). Loaded here from the directory as a user would, every
// position's logits must match and the greedy tokens must be the same.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/engine/generator.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "text/model_tokenizer.h"
#include "models/moe_model.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/models/checkpoint_test_util.h"

namespace moeserve {
namespace {

std::string Dir(const std::string& family) {
  return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/hf/" + family;
}

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

class HfFamilyTest : public ::testing::TestWithParam<std::tuple<std::string, CpuPath>> {};

TEST_P(HfFamilyTest, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = Dir(std::get<0>(GetParam()));
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  // Exact numerics (fp32 activations): the variants that round activations to bf16 are checked
  // at their own tolerance (fp8_checkpoint_test.cc, gemm_variants_test.cc).
  CpuBackend backend(
      CpuBackendOptions{std::get<1>(GetParam()), 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
  auto weights = ModelWeights::Load(*config, **checkpoint, &backend, DType::kF32);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto text = ModelTokenizer::FromDirectory(dir, config->vocab_size);
  ASSERT_TRUE(text.ok()) << text.status();

  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  for (const auto& c : expected["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(c["prompt"].get<std::string>());
    auto encoded = text->tokenizer->Encode(c["prompt"].get<std::string>(), true);
    ASSERT_TRUE(encoded.ok());
    EXPECT_EQ(*encoded, ids) << "the checkpoint's tokenizer";

    // One prefill of the whole prompt, logits at every position.
    const std::vector<float> logits = checkpoint_test::PrefillLogits(*config, **weights, &backend, ids);
    const std::vector<float> want = ReadF32(dir + "/" + c["logits"].get<std::string>());
    ASSERT_EQ(logits.size(), want.size());
    double max_abs = 0, max_ref = 0;
    int64_t worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::fabs(double{logits[i]} - want[i]);
      if (d > max_abs) {
        max_abs = d;
        worst = static_cast<int64_t>(i);
      }
      max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    }
    std::printf("%s: max-abs logit error %.3g (relative %.3g) over %zu logits\n",
                std::get<0>(GetParam()).c_str(), max_abs, max_abs / max_ref, want.size());
    EXPECT_LT(max_abs, 2e-4 * std::max(1.0, max_ref))
        << "max-abs error " << max_abs << " (relative " << max_abs / max_ref << ") at position "
        << worst / config->vocab_size << ", token " << worst % config->vocab_size;

    // Greedy continuation through the generator (prefill, then decode steps).
    auto kv = KvStorage::Create(&backend, KvLayoutFor(*config, 8, 16, DType::kF32));
    ASSERT_TRUE(kv.ok());
    MoeModel model(weights->get(), &backend);
    BlockPool pool(8);
    Generator gen(&model, &*kv, &pool);
    GenerationRequest req;
    req.prompt = ids;
    req.max_tokens = 8;
    req.sampling.temperature = 0.0f;
    auto results = gen.Run({req});
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ((*results)[0].tokens, c["greedy"].get<std::vector<int32_t>>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfFamilyTest,
    ::testing::Combine(::testing::Values("mixtral", "qwen2moe", "qwen3moe", "olmoe", "deepseekv3", "deepseekv3fp8", "glm4moe",
                                         "deepseekv2lite",
                                         "deepseekv2group", "qwen2moedense", "qwen3moedense",
                                         // The first four as transformers 5 saves them.
                                         "mixtral5", "qwen2moe5", "qwen3moe5", "olmoe5"),
                       ::testing::Values(CpuPath::kReference, CpuPath::kFast)));

TEST(HfFamilyConfigTest, WhatIsNotImplementedIsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen3_moe"})", "disagree"},
      {R"({"architectures": ["GptOssForCausalLM"]})", "is not supported"},
      {R"({"model_type": "olmoe", "clip_qkv": 8.0})", "clip_qkv 8.0 is not supported"},
      {R"({"model_type": "qwen3_moe", "use_sliding_window": true})", "use_sliding_window true"},
      {R"({"model_type": "qwen2_moe", "num_local_experts": 8})",
       "key \"num_local_experts\" is not understood"},
      {R"({"model_type": "mixtral", "num_experts": 8})", "key \"num_experts\" is not understood"},
      {R"({"model_type": "qwen3_moe", "attention_bias": true})",
       "attention_bias true is not supported"},
  };
  for (const auto& [json, want] : cases) {
    auto c = ModelConfig::FromJson(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << json << ": " << c.status();
  }
  // Each family's own key names and defaults; ToJson writes them back the same way.
  for (const char* family : {"mixtral", "qwen2moe", "qwen3moe", "olmoe"}) {
    auto c = ModelConfig::FromFile(Dir(family) + "/config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    auto again = ModelConfig::FromJson(c->ToJson());
    ASSERT_TRUE(again.ok()) << family << ": " << again.status();
    EXPECT_EQ(again->family, c->family);
    EXPECT_EQ(again->intermediate_size, c->intermediate_size);
    EXPECT_EQ(again->num_local_experts, c->num_local_experts);
    EXPECT_EQ(again->head_dim, c->head_dim);
    EXPECT_EQ(again->qk_norm, c->qk_norm);
    EXPECT_EQ(again->qkv_bias, c->qkv_bias);
    EXPECT_EQ(again->norm_topk_prob, c->norm_topk_prob);
  }
}

// Qwen-MoE's dense layers as transformers places them ((l + 1) % decoder_sparse_step, then
// mlp_only_layers), Qwen3's num_local_experts as transformers 5 writes it, and what is refused.
TEST(HfFamilyConfigTest, QwenDenseLayersAndTransformers5Keys) {
  auto c2 = ModelConfig::FromFile(Dir("qwen2moedense") + "/config.json");
  ASSERT_TRUE(c2.ok()) << c2.status();
  std::vector<bool> dense;
  for (int64_t l = 0; l < c2->num_hidden_layers; ++l) dense.push_back(c2->dense_layer(l));
  EXPECT_EQ(dense, (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(c2->dense_intermediate_size, 80);
  // Without dense layers no dense width is read (it would size the MLP workspace for nothing).
  auto plain = ModelConfig::FromFile(Dir("qwen3moe5") + "/config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->num_dense_layers(), 0);
  EXPECT_EQ(plain->dense_intermediate_size, 0);
  auto c3 = ModelConfig::FromFile(Dir("qwen3moedense") + "/config.json");
  ASSERT_TRUE(c3.ok()) << c3.status();
  EXPECT_EQ(c3->num_local_experts, 8) << "num_local_experts, as transformers 5 writes it";
  EXPECT_EQ(c3->num_dense_layers(), 1);
  EXPECT_TRUE(c3->dense_layer(1));
  auto again = ModelConfig::FromJson(c2->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->mlp_only_layers, c2->mlp_only_layers);
  EXPECT_EQ(again->decoder_sparse_step, 2);
  EXPECT_EQ(again->TotalParams(), c2->TotalParams());
  std::ifstream in(Dir("qwen3moedense") + "/config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  for (const auto& [patch, want] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"mlp_only_layers", {1, 9}}}, "\"mlp_only_layers\" holds 9, not a layer index in [0, 3)"},
           {{{"decoder_sparse_step", 0}}, "\"decoder_sparse_step\" must be >= 1"},
           {{{"num_experts", 4}}, "num_experts 4 and num_local_experts 8 disagree"}}) {
    nlohmann::json j = base;
    j.update(patch);
    auto c = ModelConfig::FromJson(j.dump());
    ASSERT_FALSE(c.ok()) << patch.dump();
    EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace moeserve
