// Safetensors checkpoints: a validating reader over memory-mapped files (single file or sharded
// with model.safetensors.index.json) and an atomic writer.
//
// Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to its start.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/file_util.h"

namespace moeserve {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping, or host memory
  size_t bytes = 0;

  int64_t numel() const;
};

// A source of named host tensors: a checkpoint on disk or weights generated in memory.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // nullptr when absent.
  virtual const TensorView* Find(const std::string& name) const = 0;
  // Whether Find would find it (a source that makes tensors on demand answers without making it).
  virtual bool Has(const std::string& name) const { return Find(name) != nullptr; }
  virtual std::vector<std::string> Names() const = 0;
};

// One .safetensors file, mapped and validated on Open: the header is valid JSON, every entry
// has a supported dtype, a shape whose size matches its byte range, offsets inside the file,
// and no two ranges overlap. Errors name the file and the offending tensor.
class SafetensorsFile : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const TensorView* Find(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (each tensor must be in the shard the index names).
class SafetensorsCheckpoint : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  const TensorView* Find(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  size_t num_files() const { return files_.size(); }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// Writes tensors (in the given order) into one file atomically.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `dir`/model.safetensors, or, when the tensors exceed `max_shard_bytes` (> 0),
// model-0000K-of-0000N.safetensors shards plus model.safetensors.index.json.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorView>& tensors,
                             size_t max_shard_bytes = 0);

}  // namespace moeserve
