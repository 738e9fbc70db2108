// The BPE model of a Hugging Face tokenizer.json: a word (a string of Unicode characters) is
// split into characters, each mapped to its vocabulary id (or, with byte fallback, to the
// <0xNN> tokens of its UTF-8 bytes, else to the unknown token), and adjacent pairs are merged
// by rank, the lowest rank first and the leftmost among equals, as the tokenizers library does.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve {

class BpeModel {
 public:
  struct Options {
    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::pair<std::string, std::string>> merges;  // in rank order
    bool byte_fallback = false;
    std::string unk_token;  // empty: none
    bool fuse_unk = false;
    bool ignore_merges = false;  // a word found whole in the vocabulary is not merged
  };
  static absl::StatusOr<BpeModel> Create(Options options);

  // Appends the ids of `word` to `out`.
  void Tokenize(absl::string_view word, std::vector<int32_t>* out) const;
  // The vocabulary's token for `id` ("" when none), and the size of the id space.
  const std::string& Token(int32_t id) const;
  int32_t Find(absl::string_view token) const;  // -1 when absent
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // of the merged token
  };
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;             // id -> token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t byte_ids_[256];                       // <0xNN> tokens, -1 when absent
  bool byte_fallback_ = false;
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string none_;
};

}  // namespace moeserve
