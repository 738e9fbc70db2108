// Safetensors reader and writer: round trips and sharded checkpoints
// (safetensors_malformed_test.cc: malformed files and directories; checkpoint_load_test.cc:
// what ModelWeights::Load makes of them).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

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

namespace fs = std::filesystem;

std::string FreshDir() { return testing::MakeTempDir("safetensors"); }

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A tensor whose bytes the test owns.
struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  TensorView View() const {
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = shape;
    v.data = bytes.data();
    v.bytes = bytes.size();
    return v;
  }
};

OwnedTensor RandomTensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                         std::mt19937& gen) {
  OwnedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(gen);
  t.bytes.resize(n * DTypeSize(dtype));
  ConvertFromF32(values.data(), n, dtype, t.bytes.data());
  return t;
}

std::vector<TensorView> Views(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorView> out;
  for (const auto& t : tensors) out.push_back(t.View());
  return out;
}

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// Checks that `got` holds exactly the tensor `want`.
void ExpectSameTensor(const TensorView* got, const OwnedTensor& want) {
  ASSERT_NE(got, nullptr) << "tensor \"" << want.name << "\" not found after reading back";
  EXPECT_EQ(got->name, want.name);
  EXPECT_EQ(got->dtype, want.dtype) << want.name << ": dtype " << DTypeSafetensorsName(got->dtype)
                                    << " != " << DTypeSafetensorsName(want.dtype);
  EXPECT_EQ(got->shape, want.shape) << want.name << ": shape " << ShapeStr(got->shape) << " != "
                                    << ShapeStr(want.shape);
  ASSERT_EQ(got->bytes, want.bytes.size()) << want.name;
  if (!want.bytes.empty()) {
    ASSERT_NE(got->data, nullptr) << want.name;
    EXPECT_EQ(std::memcmp(got->data, want.bytes.data(), want.bytes.size()), 0)
        << want.name << ": bytes differ after the round trip";
  }
}

std::vector<OwnedTensor> AwkwardTensors(uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<OwnedTensor> t;
  t.push_back(RandomTensor("model.f32.matrix", DType::kF32, {3, 5}, gen));
  t.push_back(RandomTensor("model.bf16.scalar", DType::kBF16, {}, gen));
  t.push_back(RandomTensor("model.f16.with_one", DType::kF16, {7, 1, 3}, gen));
  t.push_back(RandomTensor("model.f32.single", DType::kF32, {1}, gen));
  t.push_back(RandomTensor("model.bf16.odd", DType::kBF16, {5, 9, 1}, gen));
  t.push_back(RandomTensor("model.f16.scalar", DType::kF16, {}, gen));
  t.push_back(RandomTensor("model.f32.scalar", DType::kF32, {}, gen));
  t.push_back(RandomTensor("model.f16.odd_length", DType::kF16, {13}, gen));
  return t;
}

TEST(SafetensorsTest, RoundTripsDtypesShapesAndMetadata) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/t.safetensors";
  const std::vector<OwnedTensor> tensors = AwkwardTensors(11);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  absl::Status s = WriteSafetensors(path, Views(tensors), metadata);
  ASSERT_TRUE(s.ok()) << s;

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> want_names;
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    ExpectSameTensor((*file)->Find(t.name), t);
    want_names.insert(t.name);
  }
  const std::vector<std::string> names = (*file)->Names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want_names);
  EXPECT_EQ(names.size(), tensors.size()) << "duplicate names";
  EXPECT_EQ((*file)->metadata(), metadata);
  EXPECT_EQ((*file)->Find("model.absent"), nullptr);
  // A scalar has one element.
  EXPECT_EQ((*file)->Find("model.bf16.scalar")->numel(), 1);
  EXPECT_EQ((*file)->Find("model.bf16.scalar")->bytes, 2u);
}

TEST(SafetensorsTest, WriterRejectsTensorWhoseBytesMismatchItsShape) {
  const std::string dir = FreshDir();
  std::mt19937 gen(5);
  OwnedTensor t = RandomTensor("bad.size", DType::kF32, {4}, gen);
  TensorView v = t.View();
  v.bytes = 12;
  absl::Status s = WriteSafetensors(dir + "/x.safetensors", {v});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(Msg(s), "bad.size")) << s;
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors")) << "a failed write left a file behind";
}

std::vector<OwnedTensor> ManyTensors(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dim(1, 40);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  std::vector<OwnedTensor> t;
  for (int i = 0; i < 24; ++i) {
    std::vector<int64_t> shape = {dim(gen), dim(gen)};
    if (i % 5 == 0) shape = {dim(gen)};
    if (i % 7 == 0) shape = {};
    t.push_back(RandomTensor(absl::StrCat("model.layers.", i, ".weight"), dtypes[i % 3], shape, gen));
  }
  return t;
}

TEST(SafetensorsTest, ShardedCheckpointFindsEveryTensor) {
  const std::string dir = FreshDir();
  const std::vector<OwnedTensor> tensors = ManyTensors(21);
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  const size_t max_shard = 2048;
  ASSERT_GT(total, 3 * max_shard) << "test data too small to need several shards";
  absl::Status s = WriteCheckpoint(dir, Views(tensors), max_shard);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));

  // Every shard is a valid file no larger than the limit (unless it holds a single tensor).
  size_t shard_files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "temp file left behind: " << name;
    if (!absl::EndsWith(name, ".safetensors")) continue;
    ++shard_files;
    auto shard = SafetensorsFile::Open(e.path().string());
    ASSERT_TRUE(shard.ok()) << shard.status();
    size_t bytes = 0;
    for (const auto& n : (*shard)->Names()) bytes += (*shard)->Find(n)->bytes;
    EXPECT_TRUE(bytes <= max_shard || (*shard)->Names().size() == 1)
        << name << " holds " << bytes << " bytes in " << (*shard)->Names().size() << " tensors";
  }

  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_GT((*ckpt)->num_files(), 1u);
  EXPECT_EQ((*ckpt)->num_files(), shard_files);
  std::set<std::string> want_names;
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    ExpectSameTensor((*ckpt)->Find(t.name), t);
    want_names.insert(t.name);
  }
  const std::vector<std::string> names = (*ckpt)->Names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want_names);
  EXPECT_EQ((*ckpt)->Find("model.absent"), nullptr);
}

TEST(SafetensorsTest, SingleFileCheckpoint) {
  const std::string dir = FreshDir();
  const std::vector<OwnedTensor> tensors = ManyTensors(22);
  absl::Status s = WriteCheckpoint(dir, Views(tensors));  // no shard limit
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 1u);
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    ExpectSameTensor((*ckpt)->Find(t.name), t);
  }
  EXPECT_EQ((*ckpt)->Names().size(), tensors.size());
}

}  // namespace
}  // namespace moeserve
