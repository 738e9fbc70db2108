// The layout explorer (`moeserve explore`) run as the real binary: every layout of a model on N
// devices with the best per sequences count, and, with --measure, the layouts this machine can
// run measured beside their prediction, as threads and as processes.
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

}  // namespace
}  // namespace moeserve::testing
