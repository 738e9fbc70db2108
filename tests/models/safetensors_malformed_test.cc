// Safetensors files and checkpoint directories that are malformed, built by hand: each is
// refused at open with a message naming the file and what is wrong (a short file, a header past
// the end or not a JSON object, a missing or unsupported dtype, a negative shape, data offsets
// outside the data or overlapping, an index naming a missing shard or tensor, a shard path that
// leaves the directory). A hand-built valid file and index open, as controls.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "models/safetensors.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

std::string FreshDir() { return testing::MakeTempDir("safetensors_malformed"); }

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

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

// Writes one valid shard holding `tensor_name` (2 x 3 floats) into `dir` under `shard_name`.
void WriteShard(const std::string& dir, const std::string& shard_name, const std::string& tensor_name) {
  static const float kValues[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f};
  TensorView t;
  t.name = tensor_name;
  t.dtype = DType::kF32;
  t.shape = {2, 3};
  t.data = kValues;
  t.bytes = sizeof(kValues);
  absl::Status s = WriteSafetensors(dir + "/" + shard_name, {t});
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
