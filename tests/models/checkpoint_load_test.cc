// ModelWeights::Load on safetensors checkpoints: a complete one loads as f32 and bf16 (values,
// w1 stacked on w3, fp32 norms), an f16 one widens to f32, and a missing or misshapen tensor is
// named in the error.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model_config.h"
#include "models/model_weights.h"
#include "models/safetensors.h"
#include "models/tensor_names.h"
#include "models/weight_init.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }
std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

class WeightsLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = PresetConfig("tiny");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    weights_ = GenerateRandomWeights(config_, /*seed=*/1234, DType::kF32);
    ASSERT_NE(weights_, nullptr);
    dir_ = testing::MakeTempDir("load");
  }

  // Writes `tensors` as a (sharded) checkpoint in a new subdirectory and opens it.
  std::unique_ptr<SafetensorsCheckpoint> WriteAndOpen(const std::string& sub,
                                                      const std::vector<TensorView>& tensors) {
    const std::string dir = dir_ + "/" + sub;
    absl::Status s = WriteCheckpoint(dir, tensors, /*max_shard_bytes=*/64 << 10);
    EXPECT_TRUE(s.ok()) << s;
    auto ckpt = SafetensorsCheckpoint::Open(dir);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    return ckpt.ok() ? std::move(*ckpt) : nullptr;
  }

  // The values a weight of `storage` dtype should hold after loading `src`.
  static std::vector<float> Expected(const TensorView& src, DType storage) {
    const size_t n = static_cast<size_t>(src.numel());
    std::vector<float> f(n);
    ConvertToF32(src.data, src.dtype, n, f.data());
    if (storage != DType::kF32) {
      std::vector<uint8_t> tmp(n * DTypeSize(storage));
      ConvertFromF32(f.data(), n, storage, tmp.data());
      ConvertToF32(tmp.data(), storage, n, f.data());
    }
    return f;
  }

  static std::vector<float> Download(Backend* backend, const WeightRef& w) {
    const size_t n = static_cast<size_t>(w.rows * w.cols);
    std::vector<uint8_t> raw(n * DTypeSize(w.dtype));
    EXPECT_TRUE(backend->CopyToHost(raw.data(), w.data, raw.size()).ok());
    std::vector<float> out(n);
    ConvertToF32(raw.data(), w.dtype, n, out.data());
    return out;
  }

  // Loads `source` with `storage` and checks a sample of the loaded values against it.
  void LoadAndCheck(const TensorSource& source, DType storage) {
    CpuBackend backend(CpuBackendOptions{CpuPath::kReference});
    auto w = ModelWeights::Load(config_, source, &backend, storage);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->dtype(), storage);
    EXPECT_GT((*w)->total_bytes(), 0u);
    const int64_t h = config_.hidden_size, inter = config_.intermediate_size;

    const WeightRef& embed = (*w)->embed();
    EXPECT_EQ(embed.dtype, storage);
    EXPECT_EQ(embed.rows, config_.vocab_size);
    EXPECT_EQ(embed.cols, h);
    EXPECT_EQ(Download(&backend, embed), Expected(*source.Find(tensor_names::Embed()), storage))
        << "embedding values differ from the checkpoint";

    // The fused expert matrix is w1 stacked on w3.
    const int64_t l = config_.num_hidden_layers - 1, e = config_.num_local_experts - 1;
    const WeightRef& w13 = (*w)->layer(l).w13.at(e);
    ASSERT_EQ(w13.rows, 2 * inter);
    ASSERT_EQ(w13.cols, h);
    std::vector<float> want = Expected(*source.Find(tensor_names::Expert(l, e, "w1")), storage);
    const std::vector<float> w3 = Expected(*source.Find(tensor_names::Expert(l, e, "w3")), storage);
    want.insert(want.end(), w3.begin(), w3.end());
    EXPECT_EQ(Download(&backend, w13), want) << "w13 is not [w1; w3]";

    // Norms stay fp32 whatever the storage dtype.
    std::vector<float> norm(h);
    ASSERT_TRUE(backend.CopyToHost(norm.data(), (*w)->final_norm(), h * sizeof(float)).ok());
    EXPECT_EQ(norm, Expected(*source.Find(tensor_names::FinalNorm()), DType::kF32));
  }

  ModelConfig config_;
  std::unique_ptr<HostTensorSet> weights_;
  std::string dir_;
};

TEST_F(WeightsLoadTest, MissingExpertTensorIsNamed) {
  const std::string missing = tensor_names::Expert(1, 2, "w3");
  std::vector<TensorView> tensors;
  bool dropped = false;
  for (const auto& t : weights_->Ordered()) {
    if (t.name == missing) {
      dropped = true;
      continue;
    }
    tensors.push_back(t);
  }
  ASSERT_TRUE(dropped) << missing << " is not among the generated tensors";
  auto ckpt = WriteAndOpen("missing", tensors);
  ASSERT_NE(ckpt, nullptr);
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference});
  auto w = ModelWeights::Load(config_, *ckpt, &backend, DType::kF32);
  ASSERT_FALSE(w.ok()) << "a checkpoint missing " << missing << " loaded";
  EXPECT_TRUE(absl::StrContains(Msg(w.status()), missing)) << w.status();
  EXPECT_TRUE(absl::StrContains(Msg(w.status()), "missing")) << w.status();
  EXPECT_EQ(backend.used_bytes(), 0u) << "a failed load kept device memory";
}

TEST_F(WeightsLoadTest, WrongShapeIsNamedWithBothShapes) {
  const std::string name = tensor_names::Layer(0, "self_attn.k_proj.weight");
  std::vector<int64_t> want_shape;
  for (const auto& e : ExpectedTensors(config_)) {
    if (e.name == name) want_shape = e.shape;
  }
  ASSERT_EQ(want_shape.size(), 2u) << name << " is not an expected matrix";
  ASSERT_NE(want_shape[0], want_shape[1]) << "transposing would not change the shape";
  const std::vector<int64_t> bad_shape = {want_shape[1], want_shape[0]};  // same byte count
  std::vector<TensorView> tensors = weights_->Ordered();
  bool changed = false;
  for (auto& t : tensors) {
    if (t.name == name) {
      t.shape = bad_shape;
      changed = true;
    }
  }
  ASSERT_TRUE(changed);
  auto ckpt = WriteAndOpen("wrong_shape", tensors);
  ASSERT_NE(ckpt, nullptr);
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference});
  auto w = ModelWeights::Load(config_, *ckpt, &backend, DType::kF32);
  ASSERT_FALSE(w.ok()) << "a checkpoint with " << name << " of shape " << ShapeStr(bad_shape) << " loaded";
  const std::string msg = Msg(w.status());
  const std::string compact = absl::StrReplaceAll(msg, {{" ", ""}});
  EXPECT_TRUE(absl::StrContains(msg, name)) << w.status();
  EXPECT_TRUE(absl::StrContains(msg, "[")) << w.status();
  EXPECT_TRUE(absl::StrContains(compact, ShapeStr(bad_shape))) << "lacks the checkpoint's shape: " << w.status();
  EXPECT_TRUE(absl::StrContains(compact, ShapeStr(want_shape))) << "lacks the expected shape: " << w.status();
  EXPECT_EQ(backend.used_bytes(), 0u) << "a failed load kept device memory";
}

TEST_F(WeightsLoadTest, CompleteCheckpointLoadsAsF32AndBf16) {
  auto ckpt = WriteAndOpen("complete", weights_->Ordered());
  ASSERT_NE(ckpt, nullptr);
  EXPECT_GT(ckpt->num_files(), 1u) << "the checkpoint was meant to be sharded";
  {
    SCOPED_TRACE("f32 storage");
    LoadAndCheck(*ckpt, DType::kF32);
  }
  {
    SCOPED_TRACE("bf16 storage");
    LoadAndCheck(*ckpt, DType::kBF16);
  }
}

TEST_F(WeightsLoadTest, F16CheckpointLoadsWithF32Storage) {
  HostTensorSet f16;
  for (const auto& t : weights_->Ordered()) {
    ASSERT_EQ(t.dtype, DType::kF32) << t.name;
    void* dst = f16.Add(t.name, DType::kF16, t.shape);
    ConvertFromF32(static_cast<const float*>(t.data), static_cast<size_t>(t.numel()), DType::kF16, dst);
  }
  auto ckpt = WriteAndOpen("f16", f16.Ordered());
  ASSERT_NE(ckpt, nullptr);
  for (const auto& n : ckpt->Names()) {
    ASSERT_EQ(ckpt->Find(n)->dtype, DType::kF16) << n;
  }
  LoadAndCheck(*ckpt, DType::kF32);
}

}  // namespace
}  // namespace moeserve
