// The calibrated model's fit: known efficiencies recovered from synthetic steps, a fit pushed to a
// limit said so, and the knee of a two-segment curve.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "roofline/calibration_fit.h"
#include "roofline/model_presets.h"

namespace moeserve::roofline {
namespace {

// A CPU-like machine whose bounds the fits below are checked against.
HardwareProfile Synthetic() {
  HardwareProfile hw;
  hw.name = "synthetic";
  hw.peak_flops_bf16 = 80e9;
  hw.mem_bandwidth = 25e9;
  hw.mem_capacity = 16e9;
  return hw;
}

// Steps faster than a term's peak allows push its efficiency to the limit: the fit says so
// (degenerate) instead of reporting an efficiency above 1; a term too small to matter is
// reported as not pinned down.
TEST(CalibrationFitTest, AFitPushedToALimitIsDegenerateAndSaysWhy) {
  auto c = AnalysisPreset("small");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  const HardwareProfile hw = Synthetic();
  std::vector<Observation> obs;
  for (int64_t b = 1; b <= 64; b *= 2) {
    const StepCost cost = PredictStep(m, StepShape::Decode(b, 128), hw);
    obs.push_back({cost, 0.5 * cost.bound_seconds});  // twice as fast as the bound
  }
  const FitResult fit = FitEfficiency(obs);
  ASSERT_TRUE(fit.Degenerate());
  EXPECT_NE(fit.at_limit[0].find("efficiency at 1"), std::string::npos) << fit.at_limit[0];
  EXPECT_LE(fit.efficiency.memory, 1.0);
  EXPECT_LE(fit.efficiency.compute, 1.0);
  bool attention_unidentified = false;
  for (const std::string& u : fit.unidentified) attention_unidentified |= u.find("attention") != std::string::npos;
  EXPECT_TRUE(attention_unidentified) << "context 128: attention is a sliver of every step";
}

TEST(CalibrationFitTest, RecoversKnownEfficienciesFromSyntheticSteps) {
  auto c = AnalysisPreset("small");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  const HardwareProfile hw = Synthetic();
  const uint64_t seed = std::getenv("FIT_SEED") ? std::strtoull(std::getenv("FIT_SEED"), nullptr, 10) : std::random_device{}();
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0.2, 0.95);
  Efficiency truth;
  truth.compute = u(gen);
  truth.attention = u(gen) / 2;
  truth.memory = u(gen);
  truth.overlap = u(gen);
  truth.overhead_seconds = 0.5e-3;
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<Observation> obs;
  for (int64_t ctx : {128, 1024, 4000}) {
    for (int64_t b = 1; b <= 256; b *= 2) {
      const StepCost cost = PredictStep(m, StepShape::Decode(b, ctx), hw);
      obs.push_back({cost, PredictWithEfficiency(cost, truth) * (1 + noise(gen))});
    }
  }
  const FitResult fit = FitEfficiency(obs);
  EXPECT_LT(fit.median_abs_rel_error, 0.02) << "1% noise";
  // The fit predicts the noiseless truth closely wherever it was observed.
  for (const Observation& o : obs) {
    const double want = PredictWithEfficiency(o.cost, truth);
    EXPECT_NEAR(PredictWithEfficiency(o.cost, fit.efficiency) / want, 1.0, 0.05)
        << "seed " << seed << " truth compute " << truth.compute << " attention " << truth.attention << " memory "
        << truth.memory << " overlap " << truth.overlap << "; fit " << fit.efficiency.compute << " "
        << fit.efficiency.attention << " " << fit.efficiency.memory << " " << fit.efficiency.overlap << " "
        << fit.efficiency.overhead_seconds;
  }
  // PredictStep with the efficiency applies the same formula.
  const StepCost direct = PredictStep(m, StepShape::Decode(8, 1024), hw, {}, truth);
  EXPECT_NEAR(direct.seconds, PredictWithEfficiency(direct, truth), 1e-15);
}

TEST(CalibrationFitTest, KneeOfATwoSegmentCurveIsItsCorner) {
  std::vector<double> b, t;
  const double a = 6e-3, slope = 0.4e-3;  // corner at batch 15
  for (double x = 1; x <= 512; x *= 2) {
    b.push_back(x);
    t.push_back(std::max(a, slope * x));
  }
  EXPECT_NEAR(MeasuredKnee(b, t), a / slope, 0.02 * a / slope);
}

}  // namespace
}  // namespace moeserve::roofline
