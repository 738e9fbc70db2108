// Safetensors reader and writer: round trips, sharded checkpoints and malformed files
// (checkpoint_load_test.cc: what ModelWeights::Load makes of them).
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

// A fresh, empty directory unique to this call.
std::string FreshDir() {
  const std::string dir = testing::FreshTempPath("safetensors");
  fs::create_directories(dir);
  return dir;
}

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

// ---- Malformed files, built by hand. ----

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(f.good()) << "cannot write " << path;
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// 8-byte little-endian header length, then the header text, then `data`.
std::string SafetensorsBytes(const std::string& header, const std::string& data,
                             uint64_t header_len_field) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header_len_field >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return SafetensorsBytes(header, data, header.size());
}

// Writes a hand-built file into a fresh directory and opens it; the status of the open.
absl::Status OpenHandBuilt(const std::string& bytes, std::string* path_out = nullptr) {
  const std::string path = FreshDir() + "/bad.safetensors";
  WriteBytes(path, bytes);
  if (path_out != nullptr) *path_out = path;
  auto file = SafetensorsFile::Open(path);
  return file.status();
}

// Expects a non-OK status whose message contains the file name and every one of `parts`.
void ExpectError(const absl::Status& s, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.ok()) << "malformed input was accepted";
  EXPECT_TRUE(absl::StrContains(Msg(s), "bad.safetensors")) << "message does not name the file: " << s;
  for (const auto& p : parts) {
    EXPECT_TRUE(absl::StrContains(Msg(s), p)) << "message lacks \"" << p << "\": " << s;
  }
}

TEST(SafetensorsMalformedTest, HandBuiltValidFileOpens) {
  // The control for the cases below: the same construction with consistent fields is accepted.
  const std::string data(24, '\x01');
  std::string path;
  const absl::Status s = OpenHandBuilt(
      SafetensorsBytes(R"({"first":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                       R"("second":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},)"
                       R"("__metadata__":{"k":"v"}})",
                       data),
      &path);
  ASSERT_TRUE(s.ok()) << s;
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE((*file)->Find("second"), nullptr);
  EXPECT_EQ((*file)->Find("second")->shape, std::vector<int64_t>({4}));
  EXPECT_EQ((*file)->Find("second")->dtype, DType::kBF16);
  EXPECT_EQ((*file)->metadata().at("k"), "v");
}

TEST(SafetensorsMalformedTest, FileShorterThanEightBytes) {
  ExpectError(OpenHandBuilt(std::string("\x05\x00\x00\x00\x00", 5)), {"8"});
  ExpectError(OpenHandBuilt(""), {"8"});
}

TEST(SafetensorsMalformedTest, HeaderLengthPastEndOfFile) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ExpectError(OpenHandBuilt(SafetensorsBytes(header, "abcd", 1000)), {"header length", "1000"});
  // Enormous length fields must not overflow the bounds check.
  ExpectError(OpenHandBuilt(SafetensorsBytes(header, "abcd", ~uint64_t{0})), {"header length"});
}

TEST(SafetensorsMalformedTest, HeaderNotJson) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(R"({"a": {"dtype": "F32", )", "")), {"JSON"});
}

TEST(SafetensorsMalformedTest, HeaderJsonNotAnObject) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(R"([1, 2, 3])", "")), {"object"});
}

TEST(SafetensorsMalformedTest, EntryMissingDtype) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"no_dtype_tensor":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
              {"no_dtype_tensor", "dtype"});
}

TEST(SafetensorsMalformedTest, UnsupportedDtype) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"int_tensor":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'))),
              {"int_tensor", "I64"});
}

TEST(SafetensorsMalformedTest, NegativeShapeEntry) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"neg_tensor":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", std::string(16, '\0'))),
              {"neg_tensor", "shape"});
}

TEST(SafetensorsMalformedTest, DataOffsetsEndPastDataSection) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"long_tensor":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'))),
              {"long_tensor", "16", "past"});
}

TEST(SafetensorsMalformedTest, DataOffsetsBeginAfterEnd) {
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"backwards":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'))),
              {"backwards", "begin"});
}

TEST(SafetensorsMalformedTest, ByteLengthDoesNotMatchShape) {
  // [3] F32 needs 12 bytes; the range holds 8.
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"short_tensor":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(16, '\0'))),
              {"short_tensor", "12"});
  // [4] BF16 needs 8 bytes; the range holds 16 (the F32 size).
  ExpectError(OpenHandBuilt(SafetensorsBytes(
                  R"({"wide_tensor":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", std::string(16, '\0'))),
              {"wide_tensor"});
}

TEST(SafetensorsMalformedTest, OverlappingRanges) {
  const absl::Status s = OpenHandBuilt(SafetensorsBytes(
      R"({"first_tensor":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
      R"("second_tensor":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      std::string(24, '\0')));
  ExpectError(s, {"overlaps"});
  EXPECT_TRUE(absl::StrContains(Msg(s), "first_tensor") || absl::StrContains(Msg(s), "second_tensor"))
      << "message names neither tensor: " << s;
}

// ---- Malformed checkpoint directories. ----

// Writes one valid shard holding `tensor_name` into `dir` under `shard_name`.
void WriteShard(const std::string& dir, const std::string& shard_name, const std::string& tensor_name) {
  std::mt19937 gen(3);
  OwnedTensor t = RandomTensor(tensor_name, DType::kF32, {2, 3}, gen);
  absl::Status s = WriteSafetensors(dir + "/" + shard_name, {t.View()});
  ASSERT_TRUE(s.ok()) << s;
}

void WriteIndex(const std::string& dir, const std::string& weight_map_json) {
  WriteBytes(dir + "/model.safetensors.index.json",
             absl::StrCat(R"({"metadata":{"total_size":24},"weight_map":)", weight_map_json, "}"));
}

TEST(SafetensorsCheckpointErrorTest, HandBuiltIndexOpens) {
  // The control: a consistent hand-written index is accepted.
  const std::string dir = FreshDir();
  WriteShard(dir, "part-a.safetensors", "tensor_a");
  WriteShard(dir, "part-b.safetensors", "tensor_b");
  WriteIndex(dir, R"({"tensor_a":"part-a.safetensors","tensor_b":"part-b.safetensors"})");
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 2u);
  EXPECT_NE((*ckpt)->Find("tensor_a"), nullptr);
  EXPECT_NE((*ckpt)->Find("tensor_b"), nullptr);
}

TEST(SafetensorsCheckpointErrorTest, IndexNamesMissingShard) {
  const std::string dir = FreshDir();
  WriteShard(dir, "part-a.safetensors", "tensor_a");
  WriteIndex(dir, R"({"tensor_a":"part-a.safetensors","tensor_b":"part-missing.safetensors"})");
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok()) << "an index naming a missing shard was accepted";
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "part-missing.safetensors")) << ckpt.status();
}

TEST(SafetensorsCheckpointErrorTest, IndexNamesTensorAbsentFromShard) {
  const std::string dir = FreshDir();
  WriteShard(dir, "part-a.safetensors", "tensor_a");
  WriteIndex(dir, R"({"tensor_a":"part-a.safetensors","phantom_tensor":"part-a.safetensors"})");
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok()) << "an index naming a tensor its shard lacks was accepted";
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "phantom_tensor")) << ckpt.status();
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "part-a.safetensors")) << ckpt.status();
}

TEST(SafetensorsCheckpointErrorTest, IndexShardNameWithSlash) {
  const std::string dir = FreshDir();
  fs::create_directories(dir + "/sub");
  WriteShard(dir + "/sub", "part-a.safetensors", "tensor_a");
  WriteIndex(dir, R"({"tensor_a":"sub/part-a.safetensors"})");
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok()) << "a shard path outside the directory was accepted";
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "sub/part-a.safetensors")) << ckpt.status();

  WriteIndex(dir, R"({"tensor_a":"../escape.safetensors"})");
  ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok()) << "a shard path outside the directory was accepted";
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "../escape.safetensors")) << ckpt.status();
}

TEST(SafetensorsCheckpointErrorTest, DirectoryWithNeitherFile) {
  const std::string dir = FreshDir();
  WriteShard(dir, "unrelated.safetensors", "tensor_a");
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound) << ckpt.status();
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "model.safetensors")) << ckpt.status();
}

TEST(SafetensorsCheckpointErrorTest, MalformedShardErrorPropagates) {
  const std::string dir = FreshDir();
  WriteBytes(dir + "/model.safetensors", SafetensorsBytes("not json", ""));
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_TRUE(absl::StrContains(Msg(ckpt.status()), "JSON")) << ckpt.status();
}

}  // namespace
}  // namespace moeserve
