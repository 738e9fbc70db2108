// GeneratedTensors (weights made one tensor at a time, when found) against GenerateRandomWeights
// (the whole model at once): the same bytes, nothing made to check presence, and a shard's load
// makes only the shard's tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "models/model_weights.h"
#include "models/tensor_names.h"
#include "models/weight_init.h"

namespace moeserve {
namespace {

// The tiny preset (Mixtral's names) and a DeepSeek-V3 checkpoint's config (latent attention,
// shared experts, dense first layers).
std::vector<ModelConfig> Configs() {
  return {*PresetConfig("tiny"),
          *ModelConfig::FromFile(std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/hf/deepseekv3/config.json")};
}

TEST(GeneratedTensorsTest, EachTensorIsTheWholeModelsBytes) {
  for (const ModelConfig& c : Configs()) {
    SCOPED_TRACE(c.architecture());
    const uint64_t seed = std::random_device{}();
    const auto whole = GenerateRandomWeights(c, seed, DType::kBF16);
    const GeneratedTensors lazy(c, seed, DType::kBF16);
    EXPECT_EQ(lazy.Names(), whole->Names());
    for (const std::string& name : lazy.Names()) ASSERT_TRUE(lazy.Has(name)) << name;
    EXPECT_FALSE(lazy.Has("model.layers.0.mlp.bias"));
    EXPECT_EQ(lazy.Find("model.layers.0.mlp.bias"), nullptr);
    EXPECT_EQ(lazy.generated(), 0) << "Has made tensors";
    std::vector<std::string> names = lazy.Names();
    std::shuffle(names.begin(), names.end(), std::mt19937(static_cast<uint32_t>(seed)));
    for (const std::string& name : names) {
      const TensorView* got = lazy.Find(name);
      const TensorView* want = whole->Find(name);
      ASSERT_NE(got, nullptr) << name;
      ASSERT_EQ(got->shape, want->shape) << name;
      ASSERT_EQ(got->bytes, want->bytes) << name;
      ASSERT_EQ(0, std::memcmp(got->data, want->data, got->bytes)) << name << " (seed " << seed << ")";
      EXPECT_EQ(lazy.Find(name), got) << "found twice, made twice: " << name;
    }
    EXPECT_EQ(lazy.generated(), static_cast<int64_t>(names.size()));
  }
}

// Loading the experts a re-placement moves makes those experts' tensors and nothing else, and
// holds what the same shard loaded from the whole generated model holds.
TEST(GeneratedTensorsTest, AnExpertsOnlyShardMakesOnlyItsExperts) {
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0});
  for (const ModelConfig& c : Configs()) {
    SCOPED_TRACE(c.architecture());
    const int64_t layer = c.num_hidden_layers - 1;
    const std::vector<int32_t> experts = {0, static_cast<int32_t>(c.num_local_experts - 1)};
    const WeightShard shard{layer, layer + 1, {experts}, /*experts_only=*/true};
    const GeneratedTensors lazy(c, 11, DType::kBF16);
    auto a = ModelWeights::Load(c, lazy, &backend, DType::kBF16, shard);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(lazy.generated(), 3 * static_cast<int64_t>(experts.size())) << "the gate, up and down of each expert";
    auto b = ModelWeights::Load(c, *GenerateRandomWeights(c, 11, DType::kBF16), &backend, DType::kBF16, shard);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*a)->tensor_digests(), (*b)->tensor_digests());
    EXPECT_EQ((*a)->total_bytes(), (*b)->total_bytes());
  }
}

// ShardTensorNames, what a generated shard's load makes first on every core, is exactly what
// ModelWeights::Load reads for that shard: with them made first the load makes nothing more,
// and a load alone makes as many.
TEST(GeneratedTensorsTest, ShardTensorNamesAreWhatTheLoadReads) {
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0});
  ThreadPool pool(2);
  for (const ModelConfig& c : Configs()) {
    SCOPED_TRACE(c.architecture());
    const int64_t n = c.num_hidden_layers, last = n - 1;
    std::vector<int32_t> some;
    for (int32_t e = 0; e < c.num_local_experts; e += 2) some.push_back(e);
    auto Some = [&](int64_t layers) { return std::vector<std::vector<int32_t>>(static_cast<size_t>(layers), some); };
    const WeightShard shards[] = {{0, 1, Some(1)},
                                  {1, n, Some(n - 1)},
                                  {0, n, {}},
                                  {last, n, {{0, static_cast<int32_t>(c.num_local_experts - 1)}}, /*experts_only=*/true}};
    for (const WeightShard& shard : shards) {
      SCOPED_TRACE(::testing::Message() << "layers [" << shard.layer_begin << ", " << shard.layer_end << ")"
                                        << (shard.experts_only ? " experts only" : ""));
      auto names = ShardTensorNames(c, shard);
      ASSERT_TRUE(names.ok()) << names.status();
      const GeneratedTensors first(c, 5, DType::kBF16), alone(c, 5, DType::kBF16);
      first.Make(*names, pool);
      EXPECT_EQ(first.generated(), static_cast<int64_t>(names->size()));
      ASSERT_TRUE(ModelWeights::Load(c, first, &backend, DType::kBF16, shard).ok());
      EXPECT_EQ(first.generated(), static_cast<int64_t>(names->size())) << "the load read a tensor not named";
      ASSERT_TRUE(ModelWeights::Load(c, alone, &backend, DType::kBF16, shard).ok());
      EXPECT_EQ(alone.generated(), static_cast<int64_t>(names->size())) << "a tensor named that the load does not read";
    }
  }
  EXPECT_FALSE(ShardTensorNames(Configs()[0], WeightShard{0, 99, {}}).ok()) << "layers past the model";
}

}  // namespace
}  // namespace moeserve
