// End-to-end tests of the offline tools, run as the real binary: `roofline`, `calibrate`, the
// decode sweep and the tier scenario of `bench`, and `--load-format dummy` against `make-model`.
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

// --load-format dummy generates the weights a checkpoint would hold from its config.json alone:
// with make-model's seed it must produce exactly the checkpoint's tokens (read from safetensors).
// The layout explorer as a user runs it: Mixtral-8x7B on 8 H100s, JSON and CSV out, a best
// layout per sequences count that fits, the single-device layouts refused for their weights;
// and the plot renders where matplotlib is installed.
TEST(E2eToolsTest, ExploreListsTheLayoutsThatFitAndTheBest) {
  const std::string dir = MakeTempDir("explore");
  std::string out, err;
  ASSERT_EQ(RunCommand({"explore", "--preset", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "8",
                        "--sequences", "8,256", "--json", dir + "/e.json", "--csv", dir + "/e.csv"},
                       &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(ReadAll(dir + "/e.json"));
  EXPECT_EQ(j["layouts"].size(), 15u);
  for (const auto& l : j["layouts"]) {
    if (l["ep"] == 1 && l["pp"] == 1) EXPECT_FALSE(l["weights_fit"]) << l.dump();
  }
  ASSERT_EQ(j["best"].size(), 2u);
  for (const auto& b : j["best"]) EXPECT_FALSE(b["ep"].is_null()) << b.dump();
  size_t points = 0;  // (a layout with pp = 3, 5, 6 or 7 has none: 8 sequences do not split over it)
  for (const auto& l : j["layouts"]) points += l["points"].size();
  EXPECT_EQ(points, 2u * 10u);  // ep 1: pp 1, 2, 4, 8; ep 2: 1, 2, 4; ep 4: 1, 2; ep 8: 1
  const std::string csv = ReadAll(dir + "/e.csv");
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), 1 + points) << csv;
  EXPECT_NE(out.find("<- best"), std::string::npos) << out;
  EXPECT_NE(RunCommand({"explore", "--preset", "nope"}, &out, &err), 0);
  // --domain-sizes prices each layout once per domain it makes: 8 devices in domains of 2, or one.
  ASSERT_EQ(RunCommand({"explore", "--preset", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "8",
                        "--sequences", "8,256", "--domain-sizes", "2,8", "--json", dir + "/d.json"},
                       &out, &err),
            0)
      << err;
  const auto d = nlohmann::json::parse(ReadAll(dir + "/d.json"));
  size_t split = 0;
  for (const auto& l : d["layouts"]) split += l["domain_size"] == 2 ? 1 : 0;
  EXPECT_EQ(d["layouts"].size(), 15u + split);
  EXPECT_EQ(split, 12u) << "every layout of more than 2 devices; ep 1 x pp 3 and ep 2 x pp 3 among them";
  EXPECT_NE(RunCommand({"explore", "--preset", "mixtral-8x7b", "--domain-sizes", "2,-1"}, &out, &err), 0);
  EXPECT_NE(err.find("--domain-sizes"), std::string::npos) << err;
  // --expert-load prices a recorded routing: two heavy experts of each layer on rank 0 under the
  // contiguous placement, spread by the balanced one.
  nlohmann::json load = {{"layers", 32}, {"experts", 8}, {"tokens", nlohmann::json::array()}};
  for (int l = 0; l < 32; ++l) load["tokens"].push_back({800, 700, 100, 100, 100, 100, 50, 50});
  ASSERT_TRUE(WriteFileAtomically(dir + "/load.json", load.dump()).ok());
  std::map<int64_t, double> weights;  // bytes per device at pp 1, by ep, of the last run
  auto rows_imbalance = [&](const std::string& placement, const std::string& copies) {
    std::map<int64_t, double> by_ep;  // at 256 sequences, pp 1
    EXPECT_EQ(RunCommand({"explore", "--preset", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "4",
                          "--sequences", "256", "--expert-load", dir + "/load.json", "--expert-placement", placement,
                          "--expert-replicas-per-rank", copies, "--json", dir + "/r.json"},
                         &out, &err),
              0)
        << err;
    const auto j = nlohmann::json::parse(ReadAll(dir + "/r.json"));
    for (const auto& l : j["layouts"]) {
      if (l["pp"] != 1) continue;
      by_ep[l["ep"].get<int64_t>()] = l["points"][0]["expert_rows_imbalance"].get<double>();
      weights[l["ep"].get<int64_t>()] = l["weight_bytes_per_device"].get<double>();
    }
    return by_ep;
  };
  const auto contiguous = rows_imbalance("contiguous", "0"), balanced = rows_imbalance("balanced", "0");
  const auto plain_weights = weights;
  EXPECT_NEAR(contiguous.at(2), 1700.0 / 1000.0, 0.05);  // 1700 of 2000 rows on rank 0, nearly surely
  EXPECT_LT(balanced.at(2), 1.1);
  EXPECT_LT(balanced.at(4), contiguous.at(4));
  // One extra copy per rank: at ep 4 expert 0 (40% of the rows, more than a rank's share) is split.
  const auto copied = rows_imbalance("balanced", "1");
  EXPECT_LT(copied.at(4), balanced.at(4) - 0.1);
  EXPECT_NE(out.find("balanced placement, 1 extra copies per rank"), std::string::npos) << out;
  EXPECT_EQ(weights.at(1), plain_weights.at(1)) << "one rank holds every expert once";
  // Each rank holds one more expert per MoE layer: 32 layers x 3 x 4096 x 14336 bf16 parameters.
  EXPECT_NEAR(weights.at(4) - plain_weights.at(4), 32.0 * 3 * 4096 * 14336 * 2, 1e3);
  // Over two domains of 2 a copy per rank puts every copied expert in both domains: fewer bytes
  // cross than without copies; 3 per rank (12 copies of 8 experts) cannot sit once per domain,
  // so ep 4 over domains of 2 is not listed (serve refuses it).
  auto ep4_domain2 = [&](const std::string& copies) -> nlohmann::json {
    EXPECT_EQ(RunCommand({"explore", "--preset", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "4",
                          "--domain-sizes", "2", "--sequences", "256", "--expert-load", dir + "/load.json",
                          "--expert-placement", "balanced", "--expert-replicas-per-rank", copies, "--json", dir + "/c.json"},
                         &out, &err),
              0)
        << err;
    const auto c = nlohmann::json::parse(ReadAll(dir + "/c.json"));
    for (const auto& l : c["layouts"]) {
      if (l["ep"] == 4 && l["pp"] == 1 && l["domain_size"] == 2) return l["points"][0];
    }
    return nullptr;
  };
  const nlohmann::json none = ep4_domain2("0"), one = ep4_domain2("1");
  ASSERT_FALSE(none.is_null() || one.is_null());
  EXPECT_GT(none["scale_out_bytes"].get<double>(), 0);
  EXPECT_LT(one["scale_out_bytes"].get<double>(), 0.75 * none["scale_out_bytes"].get<double>()) << one.dump();
  EXPECT_TRUE(ep4_domain2("3").is_null());
  EXPECT_NE(RunCommand({"explore", "--preset", "mixtral-8x7b", "--expert-load", dir + "/load.json",
                        "--expert-replicas-per-rank", "1"},
                       &out, &err),
            0);
  EXPECT_NE(err.find("--expert-replicas-per-rank must be in [0, 4]"), std::string::npos) << err;
  load["layers"] = 31;
  load["tokens"].erase(0);
  ASSERT_TRUE(WriteFileAtomically(dir + "/short.json", load.dump()).ok());
  EXPECT_NE(RunCommand({"explore", "--preset", "mixtral-8x7b", "--expert-load", dir + "/short.json"}, &out, &err), 0);
  EXPECT_NE(err.find("--expert-load: recorded for 31 layers"), std::string::npos) << err;
  EXPECT_NE(RunCommand({"explore", "--preset", "mixtral-8x7b", "--expert-placement", "balanced"}, &out, &err), 0);
  EXPECT_NE(err.find("needs --expert-load"), std::string::npos) << err;
  EXPECT_NE(RunCommand({"explore", "--preset", "mixtral-8x7b", "--expert-load", dir + "/load.json",
                        "--expert-placement", "nope"},
                       &out, &err),
            0);
  EXPECT_NE(err.find("--expert-placement must be"), std::string::npos) << err;
  std::string py_out, py_err;
  if (RunProgram({"/usr/bin/python3", "-c", "import matplotlib"}, &py_out, &py_err) != 0) {
    GTEST_SKIP() << "python3 matplotlib not installed: " << py_err;
  }
  ASSERT_EQ(RunProgram({"/usr/bin/python3", MOESERVE_SOURCE_DIR "/clients/python/plot_explore.py", dir + "/e.json",
                        "--out", dir + "/e.png"},
                       &py_out, &py_err),
            0)
      << py_out << py_err;
  EXPECT_EQ(ReadAll(dir + "/e.png").substr(0, 4), "\x89PNG");
}

// explore --measure runs every layout this machine can run (ranks as threads) at every point
// that fits and is within the limits, and reports the measured decode speed beside the
// prediction for the layout as it runs here (JSON, CSV, and the plot's measured markers); it
// refuses a profile that is not this machine's and a model it cannot run. Speeds are not
// asserted (timed tests are not allowed): only that each point was run and both figures exist.
TEST(E2eToolsTest, ExploreMeasuresTheLayoutsThisMachineCanRun) {
  const std::string dir = MakeTempDir("explore-measure");
  const std::string hw = MOESERVE_SOURCE_DIR "/docs/data/zen4-calibrate.json";
  std::string out, err;
  ASSERT_EQ(RunCommand({"explore", "--preset", "tiny", "--hardware", hw, "--devices", "2", "--sequences", "1,2",
                        "--context", "24", "--measure", "--measure-steps", "3", "--json", dir + "/m.json",
                        "--measure-csv", dir + "/m.csv"},
                       &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(ReadAll(dir + "/m.json"));
  const std::string csv = ReadAll(dir + "/m.csv");
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), 1 + j["measured"].size()) << csv;
  EXPECT_EQ(csv.rfind("ep,pp,domain_size,sequences,ranks_as,predicted_step_seconds,measured_step_seconds,", 0), 0u) << csv;
  size_t fitting = 0;
  for (const auto& l : j["layouts"]) {
    for (const auto& p : l["points"]) fitting += p["fits"].get<bool>() ? 1 : 0;
  }
  ASSERT_TRUE(j.contains("measured")) << j.dump();
  EXPECT_EQ(j["measured"].size(), fitting) << "ep1 pp1 (1, 2), ep1 pp2 (2), ep2 pp1 (1, 2): " << j["measured"].dump();
  for (const auto& m : j["measured"]) {
    EXPECT_GT(m["measured_tokens_per_second"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["predicted_tokens_per_second"].get<double>(), 0) << m.dump();
  }
  EXPECT_NE(out.find("measured tok/s"), std::string::npos) << out;
  // With a sweep's fitted efficiencies the predictions are calibrated: slower than the bound.
  ASSERT_EQ(RunCommand({"explore", "--preset", "tiny", "--hardware", hw, "--devices", "1", "--sequences", "1",
                        "--context", "24", "--measure", "--measure-steps", "3", "--calibration",
                        MOESERVE_SOURCE_DIR "/docs/data/zen4-sweep-default.json", "--json", dir + "/c.json"},
                       &out, &err),
            0)
      << err;
  const auto cal = nlohmann::json::parse(ReadAll(dir + "/c.json"));
  ASSERT_EQ(cal["measured"].size(), 1u);
  EXPECT_LT(cal["measured"][0]["predicted_tokens_per_second"].get<double>(),
            j["measured"][0]["predicted_tokens_per_second"].get<double>())
      << "the calibrated prediction is not below the bound's";
  EXPECT_EQ(RunCommand({"explore", "--preset", "tiny", "--hardware", "h100-sxm", "--measure"}, &out, &err), 2);
  EXPECT_NE(err.find("--hardware must be its profile from `moeserve calibrate"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"explore", "--config", hw, "--hardware", hw, "--measure"}, &out, &err), 2);
  EXPECT_NE(err.find("--measure runs the model"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"explore", "--preset", "tiny", "--measure-csv", dir + "/x.csv"}, &out, &err), 2);
  EXPECT_NE(err.find("--measure-csv needs --measure"), std::string::npos) << err;
  std::string py_out, py_err;
  if (RunProgram({"/usr/bin/python3", "-c", "import matplotlib"}, &py_out, &py_err) == 0) {
    ASSERT_EQ(RunProgram({"/usr/bin/python3", MOESERVE_SOURCE_DIR "/clients/python/plot_explore.py", dir + "/m.json",
                          "--out", dir + "/m.png"},
                         &py_out, &py_err),
              0)
        << py_out << py_err;
    EXPECT_EQ(ReadAll(dir + "/m.png").substr(0, 4), "\x89PNG");
  }
  std::filesystem::remove_all(dir);
}

// --measure-processes runs each layout of several ranks again as an MPI job of that many
// processes (moeserve bench under mpirun): every such point comes back, measured and predicted.
TEST(E2eToolsTest, ExploreMeasuresLayoutsAsProcessesToo) {
#ifndef MOESERVE_MPIEXEC
  GTEST_SKIP() << "built without MPI (no mpiexec found at configure time)";
#else
  const std::string dir = MakeTempDir("explore-processes");
  const std::string hw = MOESERVE_SOURCE_DIR "/docs/data/zen4-calibrate.json";
  std::string out, err;
  ASSERT_EQ(RunCommand({"explore", "--preset", "tiny", "--hardware", hw, "--devices", "2", "--sequences", "1,2",
                        "--context", "24", "--measure", "--measure-processes", "--measure-steps", "3", "--json",
                        dir + "/m.json"},
                       &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(ReadAll(dir + "/m.json"));
  size_t threads = 0, processes = 0;
  for (const auto& m : j["measured"]) {
    (m["ranks_as"] == "processes" ? processes : threads) += 1;
    EXPECT_GT(m["measured_tokens_per_second"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["predicted_tokens_per_second"].get<double>(), 0) << m.dump();
    if (m["ranks_as"] == "processes") EXPECT_GT(m["ep"].get<int>() * m["pp"].get<int>(), 1) << m.dump();
  }
  EXPECT_EQ(threads, 5u) << j["measured"].dump();
  EXPECT_EQ(processes, 3u) << "ep1 pp2 (2), ep2 pp1 (1, 2) as processes: " << j["measured"].dump() << err;
  std::filesystem::remove_all(dir);
#endif
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
  EXPECT_EQ(
      RunCommand({"generate", "--model", dir + "/ck", "--load-format", "lazy", "--prompt-ids", "5"},
                 &out, &err),
      2);
  EXPECT_NE(err.find("--load-format"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"bench", "--load-format", "dummy", "--num-requests", "1"}, &out, &err), 2);
  EXPECT_NE(err.find("--model"), std::string::npos) << err;
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

// Servers with their own flags.

}  // namespace
}  // namespace moeserve::testing
