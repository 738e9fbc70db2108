// Sentencepiece's processor, reached through the module sp_module.cc, which is loaded with
// dlopen so that its bundled protobuf never meets gRPC's (see sp_module.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve {

class SpProcessor {
 public:
  static absl::StatusOr<std::unique_ptr<SpProcessor>> Load(const std::string& path);
  ~SpProcessor();

  // The model's ids for `text` (with its own normalizer and dummy prefix).
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text) const;
  // The text of ids that are neither control nor out of range.
  std::string Decode(const std::vector<int>& ids) const;
  int size() const;
  int PieceToId(absl::string_view piece) const;  // the unknown id when absent
  std::string IdToPiece(int id) const;
  bool IsControl(int id) const;
  bool IsUnknown(int id) const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;

  struct Api;  // the module's functions

 private:
  SpProcessor(const Api* api, void* sp) : api_(api), sp_(sp) {}
  const Api* api_;
  void* sp_;
};

}  // namespace moeserve
