// Whose KV a prefix-cache hit may serve, in every tier: another checkpoint's flash records never
// (the fingerprint covers every weight byte), another tenant's or salt's prefixes never.
#include "tests/engine/kv_tiers_fixture.h"

namespace moeserve::kv_tiers_test {
namespace {

// The shared fixture under a name of its own, so that each file instantiates only its tests.
class KvTiersIsolationTest : public KvTiersTest {};

// A checkpoint that differs from another in one tensor of one layer (layer 0's k_proj, which
// the old fingerprint's sample of three tensors never read) has another fingerprint, so a
// server of it started on the other one's flash directory serves none of its records, leaves
// them in place, and computes its own output.
TEST_P(KvTiersIsolationTest, FlashRecordsOfACheckpointDifferingInOneTensorAreNeverServed) {
  auto tensors = GenerateRandomWeights(model_.config, 7, DType::kF32);  // model_'s weights
  const TensorView* k = tensors->Find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  std::mt19937 gen(static_cast<uint32_t>(seed_));
  float* values = const_cast<float*>(static_cast<const float*>(k->data));
  values[gen() % k->numel()] += 0.5f;
  Model other_model(GetParam());
  auto other = ModelWeights::Load(model_.config, *tensors, &other_model.backend, DType::kF32);
  ASSERT_TRUE(other.ok()) << other.status();
  other_model.weights = std::move(*other);
  const uint64_t fp = ModelFingerprint(*model_.weights, model_.backend, DType::kF32, 16);
  EXPECT_NE(ModelFingerprint(*other_model.weights, other_model.backend, DType::kF32, 16), fp);
  // What a KV block means is part of the key too.
  EXPECT_NE(ModelFingerprint(*model_.weights, model_.backend, DType::kBF16, 16), fp);
  EXPECT_NE(ModelFingerprint(*model_.weights, model_.backend, DType::kF32, 8), fp);
  EXPECT_EQ(ModelFingerprint(*model_.weights, model_.backend, DType::kF32, 16), fp)
      << "the fingerprint is deterministic";
  CpuBackend reference(CpuBackendOptions{CpuPath::kReference, 1, 0});
  EXPECT_NE(ModelFingerprint(*model_.weights, reference, DType::kF32, 16), fp)
      << "another backend's arithmetic";

  const std::string dir = FreshDir();
  KvTierConfig t;
  t.flash_dir = dir;
  t.flash_bytes = 64ull << 20;
  {
    auto e = MakeEngine(model_, t, 12);
    const Result r = PlayScenario(e.get(), scenario_);
    ASSERT_EQ(r.final_event.usage.cached_prompt_tokens_flash, 48)
        << "the first model's prefix is on flash";
  }
  auto plain = MakeEngine(other_model, {}, 64);
  const std::vector<int32_t> oracle = RunAlone(plain.get(), scenario_.second, 10).tokens;
  auto e = MakeEngine(other_model, t, 12);
  const FlashStoreStats st = e->GetStats().tiers.flash;
  EXPECT_EQ(st.records, 0);
  EXPECT_GE(st.skipped_foreign, 3) << "the first model's records are skipped";
  const Result r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 0) << "another checkpoint's KV was served";
  EXPECT_EQ(r.tokens, oracle) << "seed " << seed_;
  e.reset();
  // The first model's records are still there and still served to it.
  auto again = MakeEngine(model_, t, 12);
  EXPECT_EQ(
      RunAlone(again.get(), scenario_.second, 10).final_event.usage.cached_prompt_tokens_flash, 48);
  fs::remove_all(dir);
}

// Cache namespaces hold in every tier: a prefix pushed down to DDR and flash by tenant "a" is
// served to "a" again, never to tenant "b" or to "a" with a salt, whose outputs are the same.
TEST_P(KvTiersIsolationTest, PrefixesAreSharedOnlyWithinATenantAndSaltInEveryTier) {
  const std::string dir = FreshDir();
  KvTierConfig t;
  t.host_bytes =
      2 * KvLayoutFor(model_.config, 1, 16, DType::kF32).BlockBytes();  // cascades into flash
  t.flash_dir = dir;
  t.flash_bytes = 64ull << 20;
  auto e = MakeEngine(model_, t, 12);
  RunAlone(e.get(), scenario_.first, 4, 0, "a");
  for (const auto& f : scenario_.fillers) RunAlone(e.get(), f, 8);
  e->WaitForTransfers();
  for (const auto& [tenant, salt] :
       {std::pair<std::string, std::string>{"b", ""}, {"a", "s"}, {"", ""}}) {
    const Result r = RunAlone(e.get(), scenario_.second, 10, 0, tenant, salt);
    EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
    EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 0)
        << "tenant '" << tenant << "' salt '" << salt << "'";
  }
  // Those three pushed tenant "a"'s blocks down further; "a" still finds them below the device.
  for (const auto& f : scenario_.fillers) RunAlone(e.get(), f, 8);
  e->WaitForTransfers();
  const Result r = RunAlone(e.get(), scenario_.second, 10, 0, "a");
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48);
  EXPECT_EQ(
      r.final_event.usage.cached_prompt_tokens_ddr + r.final_event.usage.cached_prompt_tokens_flash,
      48);
  EXPECT_TRUE(e->CheckAccounting());
  e.reset();  // its transfer thread may still be writing to flash
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Copies, KvTiersIsolationTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "DeferredCopyEngine" : "Synchronous";
                         });

}  // namespace
}  // namespace moeserve::kv_tiers_test
