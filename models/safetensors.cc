// Safetensors reader and writer.
#include "models/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace moeserve {
namespace {

using Json = nlohmann::json;

// Headers larger than this are refused rather than parsed (the reference implementation
// uses the same limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status BadTensor(const std::string& path, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\": ", what));
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto out = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  ASSIGN_OR_RETURN(out->file_, MappedFile::Open(path));
  const uint8_t* base = out->file_.data();
  const size_t size = out->file_.size();
  if (size < 8) return Bad(path, absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " runs past the end of the file (",
                                  size, " bytes)"));
  }
  Json header = Json::parse(reinterpret_cast<const char*>(base + 8),
                            reinterpret_cast<const char*>(base + 8 + header_len), nullptr, false);
  if (header.is_discarded()) return Bad(path, "header is not valid JSON");
  if (!header.is_object()) return Bad(path, "header must be a JSON object");

  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, std::string>> ranges;  // (begin, name) of non-empty tensors
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad(path, "__metadata__ must be an object of strings");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Bad(path, absl::StrCat("__metadata__ value of \"", k, "\" must be a string"));
        out->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return BadTensor(path, name, "entry must be an object");
    TensorView t;
    t.name = name;
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) return BadTensor(path, name, "missing string \"dtype\"");
    auto dtype = DTypeFromSafetensorsName(dt->get<std::string>());
    if (!dtype.ok()) return BadTensor(path, name, dtype.status().message());
    t.dtype = *dtype;
    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) return BadTensor(path, name, "missing array \"shape\"");
    uint64_t numel = 1;
    for (auto& d : *sh) {
      if (!d.is_number_unsigned()) return BadTensor(path, name, "shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t{1} << 62) / v) return BadTensor(path, name, "shape is too large");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return BadTensor(path, name, "\"data_offsets\" must be [begin, end] of non-negative integers");
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end) return BadTensor(path, name, absl::StrCat("data_offsets begin ", begin, " > end ", end));
    if (end > data_size) {
      return BadTensor(path, name, absl::StrCat("data_offsets end ", end, " is past the data section (",
                                                data_size, " bytes)"));
    }
    const uint64_t want = numel * DTypeSize(t.dtype);
    if (end - begin != want) {
      return BadTensor(path, name, absl::StrCat("byte range is ", end - begin, " bytes but shape and dtype need ", want));
    }
    t.data = data + begin;
    t.bytes = static_cast<size_t>(want);
    if (want > 0) ranges.emplace_back(begin, name);
    out->tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const TensorView& prev = out->tensors_.at(ranges[i - 1].second);
    if (ranges[i - 1].first + prev.bytes > ranges[i].first) {
      return BadTensor(path, ranges[i].second,
                       absl::StrCat("data overlaps tensor \"", ranges[i - 1].second, "\""));
    }
  }
  return out;
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (auto& [k, v] : tensors_) names.push_back(k);
  return names;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto out = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  if (!fs::exists(index_path)) {
    if (!fs::exists(single_path)) {
      return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json found"));
    }
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path));
    out->files_.push_back(std::move(file));
    for (const auto& name : out->files_[0]->Names()) out->index_[name] = out->files_[0]->Find(name);
    return out;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  Json index = Json::parse(text, nullptr, false);
  if (index.is_discarded() || !index.is_object()) return Bad(index_path, "not a valid JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return Bad(index_path, "missing object \"weight_map\"");
  std::map<std::string, SafetensorsFile*> shards;
  for (auto& [name, file] : wm->items()) {
    if (!file.is_string()) return Bad(index_path, absl::StrCat("weight_map[\"", name, "\"] must be a file name"));
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
      return Bad(index_path, absl::StrCat("weight_map[\"", name, "\"]: shard name \"", shard, "\" must be a plain file name"));
    }
    if (!shards.count(shard)) {
      ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((fs::path(dir) / shard).string()));
      shards[shard] = f.get();
      out->files_.push_back(std::move(f));
    }
    const TensorView* t = shards[shard]->Find(name);
    if (t == nullptr) {
      return Bad(index_path, absl::StrCat("tensor \"", name, "\" is not in its shard ", shard));
    }
    out->index_[name] = t;
  }
  return out;
}

const TensorView* SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  for (auto& [k, v] : index_) names.push_back(k);
  return names;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.bytes != static_cast<size_t>(t.numel()) * DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", t.bytes,
                                                     " bytes do not match its shape and dtype"));
    }
    header[t.name] = {{"dtype", std::string(DTypeSafetensorsName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer.Append(len, 8));
  RETURN_IF_ERROR(writer.Append(text.data(), text.size()));
  for (const auto& t : tensors) RETURN_IF_ERROR(writer.Append(t.data, t.bytes));
  return writer.Commit();
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorView>& tensors,
                             size_t max_shard_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes;
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  }
  std::vector<std::vector<TensorView>> shards(1);
  size_t in_shard = 0;
  for (const auto& t : tensors) {
    if (in_shard > 0 && in_shard + t.bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes;
  }
  Json weight_map = Json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / name).string(), shards[s], {{"format", "pt"}}));
    for (const auto& t : shards[s]) weight_map[t.name] = name;
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteFileAtomically((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace moeserve
