// `moeserve price-sheet` as the real binary: a predicted sheet whose prices follow from its own
// step times and the `roofline` command's, a small measured run on the tiny preset (seconds)
// that produces a well-formed report, and bad flags refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "tests/server/server_process.h"

namespace moeserve::testing {
namespace {

// $ per million tokens when `seconds` of `devices` devices at `usd_per_hour` make `tokens`.
double PerMillion(double usd_per_hour, double devices, double seconds, double tokens) {
  return usd_per_hour * devices / 3600.0 * seconds / tokens * 1e6;
}

void ExpectWellFormed(const nlohmann::json& s, const std::string& which) {
  for (const char* k : {"input", "output"}) {
    EXPECT_GT(s[k]["usd_per_million"].get<double>(), 0) << which << " " << k;
    EXPECT_GT(s[k]["seconds"].get<double>(), 0) << which << " " << k;
  }
  ASSERT_EQ(s["cached_input"].size(), 3u) << which;
  for (const auto& t : s["cached_input"]) EXPECT_GT(t["usd_per_million"].get<double>(), 0) << which << " " << t;
  EXPECT_FALSE(s["context"]["curve"].empty()) << which;
  EXPECT_FALSE(s["fast_mode"]["curve"].empty()) << which;
  EXPECT_FALSE(s["reading"].get<std::string>().empty()) << which;
}

TEST(E2ePriceSheetTest, PredictedPricesFollowFromTheRooflinesStepTimes) {
  const std::string dir = MakeTempDir("price");
  std::string out, err;
  ASSERT_EQ(RunCommand({"price-sheet", "--preset", "deepseek-v3-like", "--hardware", "gb200-nvl72", "--prompt-tokens",
                        "2048", "--output-tokens", "256", "--tpot-ms", "20", "--json", dir + "/ds.json", "--csv",
                        dir + "/ds.csv"},
                       &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("Output tokens cost"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(ReadAll(dir + "/ds.json"));
  const auto& p = j["predicted"];
  ExpectWellFormed(p, "predicted");
  EXPECT_FALSE(j.contains("measured"));
  const double usd = j["prices"]["usd_per_device_hour"].get<double>(), devices = j["prices"]["devices"].get<double>();
  EXPECT_EQ(usd, 6.0);
  EXPECT_EQ(devices, 72);
  // Output: the operating batch's step over its tokens; the step is what `roofline` predicts for
  // that batch at the mix's decode context (2048 + 256 / 2).
  EXPECT_EQ(p["output"]["limited_by"], "tpot");
  const int64_t batch = p["output"]["batch"].get<int64_t>();
  const double step = p["output"]["seconds"].get<double>();
  EXPECT_LE(step, 0.020) << "the operating batch meets the 20 ms TPOT";
  EXPECT_NEAR(p["output"]["usd_per_million"].get<double>(), PerMillion(usd, devices, step, double(batch)), 1e-12);
  ASSERT_EQ(RunCommand({"roofline", "--preset", "deepseek-v3-like", "--hardware", "gb200-nvl72", "--context", "2176",
                        "--batches", std::to_string(batch) + "," + std::to_string(batch * 2), "--json",
                        dir + "/roof.json"},
                       &out, &err),
            0)
      << err;
  const auto roof = nlohmann::json::parse(ReadAll(dir + "/roof.json"));
  EXPECT_NEAR(roof["rows"][0]["step_s"].get<double>(), step, 1e-12 * step);
  EXPECT_GT(roof["rows"][1]["step_s"].get<double>(), 0.020) << "twice the batch would miss the TPOT target";
  // Input: the prefill step's prompts over their tokens.
  const double prompts = p["input"]["prompts"].get<double>();
  EXPECT_NEAR(p["input"]["usd_per_million"].get<double>(),
              PerMillion(usd, devices, p["input"]["seconds"].get<double>(), prompts * 2048), 1e-12);
  EXPECT_NEAR(p["output_over_input"].get<double>(),
              p["output"]["usd_per_million"].get<double>() / p["input"]["usd_per_million"].get<double>(), 1e-12);
  // The context curve never gets cheaper, and fast mode never beats batch 1.
  double last = 0;
  for (const auto& pt : p["context"]["curve"]) {
    EXPECT_GE(pt["usd_per_million_output"].get<double>(), last) << pt;
    last = pt["usd_per_million_output"].get<double>();
  }
  // Fast mode, from the operating batch down to 1: every smaller batch is faster per sequence
  // and dearer per token, and none beats the floor.
  double speed = 0, price = 0;
  for (const auto& f : p["fast_mode"]["curve"]) {
    EXPECT_GT(f["speed_multiple"].get<double>(), speed) << f;
    EXPECT_GT(f["price_multiple"].get<double>(), price) << f;
    speed = f["speed_multiple"].get<double>();
    price = f["price_multiple"].get<double>();
    EXPECT_GE(f["step_s"].get<double>(), p["fast_mode"]["latency_floor_s"].get<double>());
  }
  EXPECT_EQ(p["fast_mode"]["curve"].back()["batch"], 1);
  const std::string csv = ReadAll(dir + "/ds.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'),
            1 + static_cast<long>(p["context"]["curve"].size() + p["fast_mode"]["curve"].size()));
}

TEST(E2ePriceSheetTest, AMeasuredRunOnTheTinyPresetGivesBothSheetsAndTheirErrors) {
  const std::string dir = MakeTempDir("price");
  // A profile written by hand: the measured side runs whatever the CPU is; the prediction is
  // only there to be compared with.
  ASSERT_TRUE(WriteFileAtomically(dir + "/hw.json",
                                  R"({"name": "test-cpu", "source": "written by price_sheet_test",
                                      "peak_flops_bf16": 1e11, "mem_bandwidth": 2e10, "mem_capacity": 4e9,
                                      "host_link_bandwidth": 1e10, "disk_read_bandwidth": 1e9,
                                      "disk_write_bandwidth": 1e9, "price_per_hour": 0.15})")
                  .ok());
  std::string out, err;
  ASSERT_EQ(RunCommand({"price-sheet", "--measure", "--preset", "tiny", "--hardware", dir + "/hw.json",
                        "--prompt-tokens", "64", "--output-tokens", "32", "--batches", "1,4,16", "--contexts", "128",
                        "--prefill-tokens", "16,64,256", "--measure-repeats", "1", "--threads", "1",
                        "--tpot-ms", "2000",  // every batch meets it, however loaded the machine
                        "--fast-lane-output", "8", "--json", dir + "/tiny.json"},
                       &out, &err),
            0)
      << out << err;
  const auto j = nlohmann::json::parse(ReadAll(dir + "/tiny.json"));
  ExpectWellFormed(j["predicted"], "predicted");
  ExpectWellFormed(j["measured"], "measured");
  const auto& m = j["measured"];
  // The tier scenario ran: one prompt's TTFT through each tier, and the restore bandwidths the
  // measured cached prices used.
  for (const char* k : {"cold", "device_hit", "ddr_hit", "flash_hit"}) {
    EXPECT_GT(m["tier_scenario"][k]["ttft_s"].get<double>(), 0) << k;
  }
  EXPECT_GT(m["tier_scenario"]["ddr_hit"]["cached_tokens_ddr"].get<int64_t>(), 0);
  EXPECT_GT(m["tier_scenario"]["flash_hit"]["cached_tokens_flash"].get<int64_t>(), 0);
  // The fast lane ran beside the operating batch of bulk requests, priced by their receipts.
  const auto& lane = m["fast_lane"];
  EXPECT_EQ(lane["bulk_requests"], 16);
  for (const char* k : {"bulk_alone", "fast"}) {
    EXPECT_GT(lane[k]["tpot_s"].get<double>(), 0) << k;
    EXPECT_GT(lane[k]["decode_usd_per_million"].get<double>(), 0) << k;
  }
  EXPECT_GT(lane["speed_multiple"].get<double>(), 0);
  EXPECT_GT(lane["price_multiple"].get<double>(), 0);
  // Decode contexts: 128 and the mix's 64 + 32 / 2 = 80; batches up to 16 fit in 4 GB.
  ASSERT_EQ(m["context"]["curve"].size(), 2u);
  EXPECT_EQ(m["context"]["curve"][0]["context"], 80);
  EXPECT_EQ(m["output"]["batch"], 16);
  EXPECT_NEAR(m["output"]["usd_per_million"].get<double>(),
              PerMillion(0.15, 1, m["output"]["seconds"].get<double>(), 16), 1e-15);
  // Every headline figure is compared, with a finite error where the prediction is not zero.
  ASSERT_GE(j["comparison"].size(), 15u);
  for (const auto& row : j["comparison"]) {
    ASSERT_TRUE(row["measured"].is_number()) << row;  // NaN would be null
    EXPECT_TRUE(std::isfinite(row["measured"].get<double>())) << row;
    if (row["predicted"].get<double>() != 0) {
      EXPECT_TRUE(row["error"].is_number()) << row;
    }
  }
  EXPECT_NE(out.find("predicted against measured"), std::string::npos) << out;
}

TEST(E2ePriceSheetTest, BadFlagsAreRefusedByName) {
  std::string out, err;
  EXPECT_EQ(RunCommand({"price-sheet", "--cache-hit-rate", "2"}, &out, &err), 2);
  EXPECT_NE(err.find("cache hit rate"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"price-sheet", "--measure", "--preset", "mixtral-8x7b"}, &out, &err), 2);
  EXPECT_NE(err.find("--preset"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"price-sheet", "--batches", "4,x"}, &out, &err), 2);
  EXPECT_NE(err.find("--batches"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"price-sheet", "--preset", "tiny", "--contexts", "999999"}, &out, &err), 2);
  EXPECT_NE(err.find("--contexts"), std::string::npos) << err;
}

}  // namespace
}  // namespace moeserve::testing
