// ModelConfig: config.json parsing and validation errors, ToJson round trips, presets and
// parameter counts against Mixtral 8x7B's published figures.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/model_config.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A Mixtral-8x7B config.json as (key, raw JSON value) pairs, so tests can edit single keys.
std::vector<std::pair<std::string, std::string>> MixtralFields() {
  return {
      {"architectures", R"(["MixtralForCausalLM"])"},
      {"attention_dropout", "0.0"},
      {"bos_token_id", "1"},
      {"eos_token_id", "2"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", "4096"},
      {"initializer_range", "0.02"},
      {"intermediate_size", "14336"},
      {"max_position_embeddings", "32768"},
      {"model_type", R"("mixtral")"},
      {"num_attention_heads", "32"},
      {"num_experts_per_tok", "2"},
      {"num_hidden_layers", "32"},
      {"num_key_value_heads", "8"},
      {"num_local_experts", "8"},
      {"output_router_logits", "false"},
      {"rms_norm_eps", "1e-05"},
      {"rope_theta", "1000000.0"},
      {"router_aux_loss_coef", "0.02"},
      {"sliding_window", "null"},
      {"tie_word_embeddings", "false"},
      {"torch_dtype", R"("bfloat16")"},
      {"transformers_version", R"("4.36.0.dev0")"},
      {"use_cache", "true"},
      {"vocab_size", "32000"},
  };
}

// The Mixtral config with `key` set to `raw_value` (added when absent), or removed when
// `raw_value` is empty.
std::string MixtralJson(const std::string& key = "", const std::string& raw_value = "") {
  auto fields = MixtralFields();
  bool found = false;
  std::string out = "{\n";
  bool first = true;
  auto emit = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, first ? "  " : ",\n  ", "\"", k, "\": ", v);
    first = false;
  };
  for (const auto& [k, v] : fields) {
    if (k == key) {
      found = true;
      if (!raw_value.empty()) emit(k, raw_value);
      continue;
    }
    emit(k, v);
  }
  if (!found && !key.empty() && !raw_value.empty()) emit(key, raw_value);
  return out + "\n}\n";
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.num_local_experts, b.num_local_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  EXPECT_EQ(a.TotalParams(), b.TotalParams());
}

TEST(ModelConfigTest, ParsesMixtral8x7B) {
  auto c = ModelConfig::FromJson(MixtralJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128) << "head_dim should default to hidden_size / num_attention_heads";
  EXPECT_EQ(c->num_local_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->has_shared_expert());
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_EQ(c->kv_dim(), 1024);
}

TEST(ModelConfigTest, MixtralParameterCountsMatchPublishedFigures) {
  auto c = ModelConfig::FromJson(MixtralJson());
  ASSERT_TRUE(c.ok()) << c.status();
  const double total = static_cast<double>(c->TotalParams());
  const double active = static_cast<double>(c->ActiveParams());
  EXPECT_LE(std::fabs(total - 46.7e9) / 46.7e9, 0.01) << "TotalParams " << total << " vs 46.7e9";
  EXPECT_LE(std::fabs(active - 12.9e9) / 12.9e9, 0.02) << "ActiveParams " << active << " vs 12.9e9";
  EXPECT_EQ(c->ExpertParams(), 3 * 4096 * 14336);
  // The only difference: the 6 experts per layer a token is not sent to.
  EXPECT_EQ(c->TotalParams() - c->ActiveParams(), 32 * 6 * c->ExpertParams());
}

TEST(ModelConfigTest, OptionalKeysTakeDefaults) {
  // Without num_key_value_heads every head has its own KV (multi-head attention).
  auto c = ModelConfig::FromJson(MixtralJson("num_key_value_heads", ""));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
  // An explicit head_dim overrides the default.
  c = ModelConfig::FromJson(MixtralJson("head_dim", "64"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->q_dim(), 32 * 64);
}

// Expects FromJson to fail with a message containing each of `parts`.
void ExpectParseError(const std::string& json, const std::vector<std::string>& parts) {
  auto c = ModelConfig::FromJson(json);
  ASSERT_FALSE(c.ok()) << "accepted invalid config:\n" << json;
  for (const auto& p : parts) {
    EXPECT_TRUE(absl::StrContains(Msg(c.status()), p)) << "message lacks \"" << p << "\": " << c.status();
  }
}

TEST(ModelConfigErrorTest, NotJson) { ExpectParseError(R"({"hidden_size": 4096,)", {"JSON"}); }

TEST(ModelConfigErrorTest, TopLevelArray) { ExpectParseError(R"([{"hidden_size": 4096}])", {"object"}); }

TEST(ModelConfigErrorTest, MissingHiddenSize) {
  ExpectParseError(MixtralJson("hidden_size", ""), {"hidden_size"});
}

TEST(ModelConfigErrorTest, HiddenSizeAsString) {
  ExpectParseError(MixtralJson("hidden_size", R"("4096")"), {"hidden_size"});
}

TEST(ModelConfigErrorTest, NegativeNumHiddenLayers) {
  ExpectParseError(MixtralJson("num_hidden_layers", "-3"), {"num_hidden_layers"});
}

TEST(ModelConfigErrorTest, HeadsNotMultipleOfKvHeads) {
  ExpectParseError(MixtralJson("num_key_value_heads", "5"), {"num_attention_heads", "num_key_value_heads"});
}

TEST(ModelConfigErrorTest, TopKExceedsExperts) {
  ExpectParseError(MixtralJson("num_experts_per_tok", "9"), {"num_experts_per_tok"});
}

TEST(ModelConfigErrorTest, OddHeadDim) { ExpectParseError(MixtralJson("head_dim", "127"), {"head_dim"}); }

TEST(ModelConfigErrorTest, VocabBelowTokenizerMinimum) {
  ExpectParseError(MixtralJson("vocab_size", "258"), {"vocab_size", "259"});
  // The minimum itself is accepted.
  auto c = ModelConfig::FromJson(MixtralJson("vocab_size", "259"));
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ModelConfigErrorTest, UnknownTorchDtype) {
  ExpectParseError(MixtralJson("torch_dtype", R"("int8")"), {"torch_dtype", "int8"});
}

TEST(ModelConfigErrorTest, ZeroRmsNormEps) {
  ExpectParseError(MixtralJson("rms_norm_eps", "0"), {"rms_norm_eps"});
  ExpectParseError(MixtralJson("rms_norm_eps", "0.0"), {"rms_norm_eps"});
}

// config.json as transformers 5 writes it: the RoPE base under rope_parameters, "dtype"
// instead of "torch_dtype", "head_dim": null. Before, this ran with the default base (1e6) and
// an f32 checkpoint was stored as bf16.
TEST(ModelConfigTest, ReadsTheTransformers5Form) {
  auto fields = MixtralFields();
  std::string out = "{";
  for (const auto& [k, v] : fields) {
    if (k == "rope_theta" || k == "torch_dtype") continue;
    absl::StrAppend(&out, "\"", k, "\": ", v, ", ");
  }
  absl::StrAppend(&out, R"("rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}, )",
                  R"("dtype": "float32", "head_dim": null})");
  auto c = ModelConfig::FromJson(out);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << out;
  EXPECT_EQ(c->rope_theta, 250000.0);
  EXPECT_EQ(c->torch_dtype, DType::kF32);
  EXPECT_EQ(c->head_dim, 128);
}

// What this build does not implement is refused, naming it, never run as something else.
TEST(ModelConfigErrorTest, UnsupportedSettingsAreRefusedByName) {
  ExpectParseError(MixtralJson("architectures", R"(["Qwen2MoeForCausalLM"])"), {"architectures", "Qwen2Moe"});
  ExpectParseError(MixtralJson("model_type", R"("qwen2_moe")"), {"model_type", "qwen2_moe"});
  ExpectParseError(MixtralJson("sliding_window", "4096"), {"sliding_window", "4096"});
  ExpectParseError(MixtralJson("rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})"), {"rope_scaling"});
  ExpectParseError(MixtralJson("rope_parameters", R"({"rope_type": "llama3", "rope_theta": 5e5})"),
                   {"rope_parameters.rope_type", "llama3"});
  ExpectParseError(MixtralJson("rope_parameters", R"({"rope_type": "default", "rope_theta": 5e5})"),
                   {"disagree"});  // with rope_theta 1e6 beside it
  ExpectParseError(MixtralJson("hidden_act", R"("gelu")"), {"hidden_act"});
  ExpectParseError(MixtralJson("attention_bias", "true"), {"attention_bias"});
  ExpectParseError(MixtralJson("dtype", R"("float16")"), {"torch_dtype and dtype disagree"});
  ExpectParseError(MixtralJson("qk_layernorm", "true"), {"qk_layernorm", "not understood"});
  // A window as long as the context is no window.
  EXPECT_TRUE(ModelConfig::FromJson(MixtralJson("sliding_window", "32768")).ok());
  EXPECT_TRUE(ModelConfig::FromJson(MixtralJson("rope_scaling", "null")).ok());
}

TEST(ModelConfigTest, ToJsonRoundTripsEveryPreset) {
  const std::vector<std::string> names = PresetNames();
  ASSERT_FALSE(names.empty());
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    auto preset = PresetConfig(name);
    ASSERT_TRUE(preset.ok()) << preset.status();
    const std::string json = preset->ToJson();
    auto back = ModelConfig::FromJson(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    ExpectSameConfig(*back, *preset);
  }
}

TEST(ModelConfigTest, ToJsonRoundTripsNonDefaultFields) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok()) << c.status();
  c->tie_word_embeddings = true;
  c->norm_topk_prob = false;
  c->shared_expert_intermediate_size = 40;
  c->torch_dtype = DType::kF16;
  c->rms_norm_eps = 3.0e-6;
  c->rope_theta = 123456.789;
  c->head_dim = 10;  // not hidden_size / heads
  ASSERT_TRUE(c->Validate().ok()) << c->Validate();
  auto back = ModelConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << c->ToJson();
  ExpectSameConfig(*back, *c);
}

TEST(ModelConfigTest, UnknownPresetIsNamed) {
  auto c = PresetConfig("nope");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(Msg(c.status()), "nope")) << c.status();
}

TEST(ModelConfigTest, PresetSizes) {
  auto small = PresetConfig("small");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->num_local_experts, 8);
  EXPECT_EQ(small->num_experts_per_tok, 2);
  EXPECT_GE(small->TotalParams(), 80e6) << small->TotalParams();
  EXPECT_LE(small->TotalParams(), 130e6) << small->TotalParams();
  EXPECT_LT(small->ActiveParams(), small->TotalParams());

  auto medium = PresetConfig("medium");
  ASSERT_TRUE(medium.ok()) << medium.status();
  EXPECT_GE(medium->num_local_experts, 16);
  EXPECT_GE(medium->TotalParams(), 0.5e9) << medium->TotalParams();
  EXPECT_LE(medium->TotalParams(), 1e9) << medium->TotalParams();

  for (const auto& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_TRUE(c->Validate().ok()) << name << ": " << c->Validate();
  }
}

TEST(ModelConfigTest, SharedExpertAddsItsParameters) {
  auto base = ModelConfig::FromJson(MixtralJson());
  ASSERT_TRUE(base.ok()) << base.status();
  auto shared = ModelConfig::FromJson(MixtralJson("shared_expert_intermediate_size", "128"));
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_EQ(shared->shared_expert_intermediate_size, 128);
  EXPECT_TRUE(shared->has_shared_expert());
  const int64_t layers = base->num_hidden_layers, hidden = base->hidden_size;
  const int64_t want = layers * (3 * hidden * 128 + hidden);  // gate, up, down + gate vector
  EXPECT_EQ(shared->TotalParams() - base->TotalParams(), want);
  // Every token uses the shared expert.
  EXPECT_EQ(shared->ActiveParams() - base->ActiveParams(), want);

  ExpectParseError(MixtralJson("shared_expert_intermediate_size", "-1"), {"shared_expert_intermediate_size"});
}

}  // namespace
}  // namespace moeserve
