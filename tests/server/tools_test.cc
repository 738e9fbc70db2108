// End-to-end tests of the offline tools, run as the real binary: `roofline`, `calibrate`, the
// decode sweep and the tier scenario of `bench`, `generate`, and `--load-format dummy` against
// `make-model` (explore_test.cc: the layout explorer).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "tests/server/server_process.h"

namespace moeserve::testing {
namespace {

TEST(E2eToolsTest, RooflineCalibrateAndDecodeSweep) {
  const std::string dir = MakeTempDir("tools");
  std::string out, err;
  ASSERT_EQ(RunCommand({"roofline", "--preset", "deepseek-v3-like", "--hardware", "gb200-nvl72",
                        "--json", dir + "/ds.json"},
                       &out, &err),
            0)
      << err;
  const auto ds = nlohmann::json::parse(ReadAll(dir + "/ds.json"));
  EXPECT_DOUBLE_EQ(ds["flops_per_byte"].get<double>(), 312.5);
  EXPECT_NEAR(ds["critical_batch"].get<double>(), 5400, 300);
  EXPECT_DOUBLE_EQ(ds["critical_batch_routed_experts"].get<double>(), 10000);
  EXPECT_NE(out.find("critical batch"), std::string::npos) << out;

  ASSERT_EQ(RunCommand({"calibrate", "--quick", "--no-progress", "--disk-dir", dir, "--out",
                        dir + "/hw.json"},
                       &out, &err),
            0)
      << err;
  const auto hw = nlohmann::json::parse(ReadAll(dir + "/hw.json"));
  for (const char* key : {"peak_flops_bf16", "peak_flops_f32", "mem_bandwidth", "mem_capacity",
                          "disk_read_bandwidth", "disk_write_bandwidth", "host_link_bandwidth"}) {
    EXPECT_GT(hw[key].get<double>(), 0) << key;
  }
  EXPECT_FALSE(hw["measurements"]["gemm"].empty());
  // Every instruction kind is either measured, with its FLOPs per instruction, or skipped with
  // the reason; the profile's peaks are those of the kinds the kernels issue.
  const std::map<std::string, double> flops_per_instruction = {
      {"f32-fma-256", 16}, {"f32-fma-512", 32}, {"bf16-dot-256", 32}, {"bf16-dot-512", 64},
      {"f16-fma-512", 64}, {"amx-bf16", 16384}};
  const auto& measured = hw["measurements"]["peak_flops_by_instruction"];
  const auto& skipped = hw["measurements"]["skipped_instruction_kinds"];
  for (const auto& [kind, fpi] : flops_per_instruction) {
    if (measured.contains(kind)) {
      EXPECT_EQ(measured[kind]["flops_per_instruction"].get<double>(), fpi) << kind;
      EXPECT_GT(measured[kind]["flops_per_second"].get<double>(), 0) << kind;
    } else {
      ASSERT_TRUE(skipped.contains(kind)) << kind << " neither measured nor skipped";
      EXPECT_FALSE(skipped[kind].get<std::string>().empty()) << kind;
    }
  }
  ASSERT_TRUE(measured.contains("f32-fma-256")) << "the build's baseline is AVX2 + FMA";
  const std::string bf16_kind = hw["measurements"]["kernel_instruction"]["bf16_weights"];
  const std::string f32_kind = hw["measurements"]["kernel_instruction"]["f32_weights"];
  EXPECT_DOUBLE_EQ(hw["peak_flops_bf16"].get<double>(), measured[bf16_kind]["flops_per_second"].get<double>());
  EXPECT_DOUBLE_EQ(hw["peak_flops_f32"].get<double>(), measured[f32_kind]["flops_per_second"].get<double>());
  EXPECT_TRUE(hw["measurements"]["gemv_weight_stream_bytes_per_second"].is_null()) << "not measured in --quick";
  EXPECT_GE(hw["measurement_spread"].get<double>(), 0);
  EXPECT_EQ(hw["measurements"]["read"]["samples"].size(), 7u);

  ASSERT_EQ(RunCommand({"bench", "--preset", "tiny", "--sweep-batch", "1,2,4", "--context", "8,32",
                        "--hardware", dir + "/hw.json", "--sweep-steps", "1", "--out",
                        dir + "/sweep.json"},
                       &out, &err),
            0)
      << out << err;
  const auto sweep = nlohmann::json::parse(ReadAll(dir + "/sweep.json"));
  ASSERT_EQ(sweep["points"].size(), 6u);
  for (const auto& p : sweep["points"]) {
    EXPECT_GT(p["observed_s"].get<double>(), 0);
    EXPECT_GT(p["bound_s"].get<double>(), 0);
    EXPECT_GT(p["calibrated_s"].get<double>(), 0);
    EXPECT_NEAR(p["observed_over_bound"].get<double>(),
                p["observed_s"].get<double>() / p["bound_s"].get<double>(), 1e-9);
  }
  // A fit pushed to a limit (six 1-step points on a loaded machine can be too noisy to pin the
  // terms down) reports no coefficients, and says which limit it hit.
  if (sweep["efficiency"].is_null()) {
    EXPECT_FALSE(sweep["fit_at_limit"].empty()) << sweep.dump();
  } else {
    EXPECT_GT(sweep["efficiency"]["compute"].get<double>(), 0);
  }
  EXPECT_EQ(sweep["knees"].size(), 2u);
  for (const auto& k : sweep["knees"]) {
    // tiny: 4 experts, top-2. Whether any decode batch is compute-bound depends on this machine's
    // FLOP/byte (a CPU with matrix units has more than tiny adds per sequence of KV): either the
    // critical batch is a whole batch with the expected experts hit, or the report says why not.
    EXPECT_DOUBLE_EQ(k["experts_hit_batch1"].get<double>(), 2.0);
    if (k["predicted_critical_batch"].is_null()) {
      const std::string why = k["no_critical_batch_reason"].get<std::string>();
      EXPECT_NE(why.find("FLOP per byte"), std::string::npos) << why;
      EXPECT_TRUE(k["measured_over_critical_batch"].is_null());
      continue;
    }
    const double b = k["predicted_critical_batch"].get<double>();
    EXPECT_EQ(b, std::floor(b)) << "the critical batch is the smallest compute-bound batch";
    EXPECT_GE(b, 1);
    EXPECT_NEAR(k["experts_hit_at_critical_batch"].get<double>(), 4.0 * (1.0 - std::pow(0.5, b)),
                1e-9)
        << b;
  }
  // The long-prompt scenario over the KV tiers (short prompt: the tiny model).
  ASSERT_EQ(RunCommand({"bench", "--preset", "tiny", "--tier-scenario", "--tier-prompt", "128",
                        "--flash-kv-dir", dir + "/flash", "--out", dir + "/tiers.json"},
                       &out, &err),
            0)
      << out << err;
  const auto tiers = nlohmann::json::parse(ReadAll(dir + "/tiers.json"));
  EXPECT_EQ(tiers["cold"]["cached_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(tiers["device_hit"]["cached_tokens"].get<int64_t>(), 128 - 16)
      << "all full blocks but the last token's";
  EXPECT_EQ(tiers["ddr_hit"]["cached_tokens_ddr"].get<int64_t>(), 112);
  EXPECT_EQ(tiers["flash_hit"]["cached_tokens_flash"].get<int64_t>(), 112);
  EXPECT_GT(tiers["measured"]["promote_from_flash_bytes_per_s"].get<double>(), 0);
  // A bad profile is refused with the key named.
  ASSERT_TRUE(WriteFileAtomically(dir + "/bad.json", R"({"peak_flops_bf16": 1})").ok());
  EXPECT_NE(RunCommand({"roofline", "--hardware", dir + "/bad.json"}, &out, &err), 0);
  EXPECT_NE(err.find("mem_bandwidth"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// `moeserve generate` runs one request on the engine the servers run: the servers' default
// max_tokens (16), their validation (the request field named), and their stop strings (the
// text cut before the first one, taken here from the uncut text).
TEST(E2eToolsTest, GenerateRunsTheServersRequest) {
  const std::vector<std::string> base = {"generate", "--preset", "tiny", "--prompt", "Generate, on the engine",
                                         "--ignore-eos"};
  auto run = [&](std::vector<std::string> extra, std::string* out, std::string* err) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunCommand(args, out, err);
  };
  std::string ids, text, err;
  ASSERT_EQ(run({"--ids"}, &ids, &err), 0) << err;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(absl::StripAsciiWhitespace(ids), ',')).size(), 16u)
      << "the servers' default max_tokens is 16: " << ids;
  EXPECT_NE(err.find("generated 16 (length)"), std::string::npos) << err;
  ASSERT_EQ(run({"--max-tokens", "40"}, &text, &err), 0) << err;
  ASSERT_FALSE(text.empty());
  text.pop_back();  // the closing newline
  // One ASCII character of the text's second half that is not in its first (the tiny model's
  // bytes are mostly not ASCII), so the cut is where it first appears.
  std::optional<size_t> at;
  for (size_t i = text.size() / 2; i < text.size() && !at; ++i) {
    if (text[i] > 32 && text[i] < 127 && text.find(text[i]) == i) at = i;
  }
  ASSERT_TRUE(at.has_value()) << "no ASCII character to stop on in the text: " << text;
  std::string cut;
  ASSERT_EQ(run({"--max-tokens", "40", "--stop", std::string(1, text[*at])}, &cut, &err), 0) << err;
  EXPECT_EQ(cut, text.substr(0, *at) + "\n") << "stop \"" << text[*at] << "\"";
  EXPECT_NE(err.find("(stop)"), std::string::npos) << err;
  EXPECT_EQ(run({"--max-tokens", "0"}, &text, &err), 2);
  EXPECT_NE(err.find("max_tokens: "), std::string::npos) << err;
  EXPECT_EQ(run({"--stop", ""}, &text, &err), 2);
  EXPECT_NE(err.find("stop: "), std::string::npos) << err;
  EXPECT_EQ(run({"--top-p", "2"}, &text, &err), 2);
  EXPECT_NE(err.find("top_p: "), std::string::npos) << err;
}

// --load-format dummy generates the weights a checkpoint would hold from its config.json alone:
// with make-model's seed it must produce exactly the checkpoint's tokens (read from safetensors).
TEST(E2eToolsTest, DummyWeightsFromAConfigEqualTheCheckpointOfTheSameSeed) {
  const std::string dir = MakeTempDir("dummy");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out",
                        dir + "/ck"},
                       &out, &err),
            0)
      << err;
  auto generate = [&](std::vector<std::string> model_args) {
    std::vector<std::string> args = {"generate",     "--prompt-ids", "5,9,200,31,7",
                                     "--max-tokens", "12",           "--ids"};
    args.insert(args.end(), model_args.begin(), model_args.end());
    std::string o, e;
    EXPECT_EQ(RunCommand(args, &o, &e), 0) << e;
    return o;
  };
  const std::string from_checkpoint = generate({"--model", dir + "/ck"});
  const std::vector<std::string> ids =
      absl::StrSplit(absl::StripAsciiWhitespace(from_checkpoint), ',', absl::SkipEmpty());
  ASSERT_GE(ids.size(), 4u) << "too few tokens to tell weights apart: " << from_checkpoint;
  EXPECT_EQ(
      generate({"--model", dir + "/ck/config.json", "--load-format", "dummy", "--model-seed", "3"}),
      from_checkpoint);
  EXPECT_NE(generate({"--model", dir + "/ck", "--load-format", "dummy", "--model-seed", "4"}),
            from_checkpoint)
      << "another seed, other weights";
  // make-model --config: a checkpoint of any config.json's shape, the same weights again.
  ASSERT_EQ(RunCommand({"make-model", "--config", dir + "/ck/config.json", "--dtype", "f32", "--seed", "3", "--out",
                        dir + "/from-config"},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(generate({"--model", dir + "/from-config"}), from_checkpoint);
  EXPECT_NE(RunCommand({"make-model", "--config", dir + "/ck/config.json", "--preset", "small", "--out", dir + "/x"},
                       &out, &err),
            0);
  EXPECT_NE(err.find("--preset excludes --config"), std::string::npos) << err;
  {
    auto text = ReadFileToString(dir + "/ck/config.json");
    ASSERT_TRUE(text.ok()) << text.status();
    nlohmann::json small_vocab = nlohmann::json::parse(*text);
    small_vocab["vocab_size"] = 200;
    ASSERT_TRUE(WriteFileAtomically(dir + "/small-vocab.json", small_vocab.dump()).ok());
  }
  EXPECT_EQ(RunCommand({"make-model", "--config", dir + "/small-vocab.json", "--out", dir + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("\"vocab_size\" must be at least 259, got 200"), std::string::npos) << err;
  EXPECT_EQ(
      RunCommand({"generate", "--model", dir + "/ck", "--load-format", "lazy", "--prompt-ids", "5"},
                 &out, &err),
      2);
  EXPECT_NE(err.find("--load-format"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"bench", "--load-format", "dummy", "--num-requests", "1"}, &out, &err), 2);
  EXPECT_NE(err.find("--model"), std::string::npos) << err;
  // A workload the model refuses whole is an error naming why, not a report of zeros; one it
  // refuses in part reports the rest and says how many were refused.
  const std::string refused_out = dir + "/refused.json";
  EXPECT_EQ(RunCommand({"bench", "--preset", "tiny", "--num-requests", "2", "--prompt-len", "100000", "--out",
                        refused_out},
                       &out, &err),
            2);
  EXPECT_NE(err.find("every request was refused (2), the first: prompt: the prompt has 100000 tokens"),
            std::string::npos)
      << err;
  EXPECT_EQ(out.find("throughput"), std::string::npos) << "no report of zeros: " << out;
  EXPECT_FALSE(std::filesystem::exists(refused_out)) << "no --out file of zeros";
  EXPECT_EQ(RunCommand({"bench", "--preset", "tiny", "--num-requests", "8", "--prompt-len", "4:2000", "--seed", "1"},
                       &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("  refused: "), std::string::npos) << out;
  // A config.json without dummy weights, and dummy weights from a file that is not there.
  EXPECT_EQ(
      RunCommand({"generate", "--model", dir + "/ck/config.json", "--prompt-ids", "5"}, &out, &err),
      2);
  EXPECT_NE(err.find("--load-format dummy"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"generate", "--model", dir + "/missing.json", "--load-format", "dummy",
                        "--prompt-ids", "5"},
                       &out, &err),
            2);
  EXPECT_NE(err.find("--model: "), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// make-model writes each family as transformers reads it: the greedy tokens below are what
// transformers 4.57.1 generated from these directories (scripts/make-model-transformers-check.py),
// and --load-format dummy regenerates the same weights from each config.json.
TEST(E2eToolsTest, MakeModelWritesEveryFamilyAsTransformersReadsIt) {
  const std::string dir = MakeTempDir("families");
  // The greedy tokens transformers 4.57.1 (5.19 for DeepSeek and GLM; its FP8 loader dequantizes
  // on a CPU) gives for each directory (scripts/make-model-transformers-check.py).
  const std::tuple<const char*, const char*, const char*> families[] = {
      {"mixtral", "none", "219,148,233,55,98,89,94,24"},
      {"qwen2_moe", "none", "109,144,76,108,104,123,223,166"},
      {"qwen3_moe", "none", "219,113,268,98,89,204,266,54"},
      {"qwen3_moe", "fp8", "81,84,10,96,76,108,52,109"},  // as Qwen3-FP8 ships
      {"olmoe", "none", "219,113,268,98,89,204,266,54"},
      {"deepseek_v3", "none", "248,199,125,164,110,81,110,81"},
      {"deepseek_v3", "fp8", "248,199,125,164,110,81,110,81"},
      {"deepseek_v2", "none", "265,37,110,267,14,256,21,72"},
      {"glm4_moe", "none", "202,155,33,130,15,26,232,202"}};
  for (const auto& [family, quantization, want] : families) {
    SCOPED_TRACE(absl::StrCat(family, " ", quantization));
    const std::string ck = absl::StrCat(dir, "/", family, "_", quantization);
    std::string out, err;
    ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--family", family, "--dtype", "f32",
                          "--quantization", quantization, "--seed", "3", "--out", ck},
                         &out, &err),
              0)
        << err;
    for (const char* file :
         {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
      EXPECT_TRUE(std::filesystem::exists(ck + "/" + file)) << file;
    }
    const std::vector<std::string> prompt = {
        "--prompt-ids", "256,72,101,108,108,111,32,119", "--max-tokens", "8", "--temperature", "0",
        "--ids"};
    std::vector<std::string> args = {"generate", "--model", ck};
    args.insert(args.end(), prompt.begin(), prompt.end());
    ASSERT_EQ(RunCommand(args, &out, &err), 0) << err;
    EXPECT_EQ(absl::StripAsciiWhitespace(out), want);
    args = {"generate",     "--model", ck + "/config.json", "--load-format", "dummy",
            "--model-seed", "3"};
    args.insert(args.end(), prompt.begin(), prompt.end());
    ASSERT_EQ(RunCommand(args, &out, &err), 0) << err;
    EXPECT_EQ(absl::StripAsciiWhitespace(out), want);
  }
  std::string out, err;
  EXPECT_EQ(RunCommand({"make-model", "--family", "gpt2", "--out", dir + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("--family: unknown family \"gpt2\""), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::testing
