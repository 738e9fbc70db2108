// The text stages of a Hugging Face tokenizer.json before its model: the normalizer and the
// pre-tokenizer, each a flat list of steps (a "Sequence" is flattened when loaded). Only the
// components the served families ship are implemented; any other is refused by name, because a
// tokenizer that silently skips a step produces other ids than the model was trained on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "text/utf8_chars.h"

namespace moeserve {

// A piece of text on its way to the model; `at_start` when it begins at offset 0 of the
// original text (Metaspace's prepend_scheme "first" prepends to that piece only).
struct TextPiece {
  std::string text;
  bool at_start = false;
};

class Regex;  // a compiled PCRE2 pattern (text/regex.h)

// How a split keeps the delimiters it finds, as the tokenizers library's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kNfc, kNfd, kNfkc, kNfkd, kStrip };
  Kind kind;
  std::string text;                    // Prepend: the prefix; Replace: the literal pattern
  std::string content;                 // Replace: what replaces it
  std::shared_ptr<const Regex> regex;  // Replace with a Regex pattern
  bool left = false, right = false;    // Strip
};

struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits };
  Kind kind;
  // ByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;
  // Split (a literal or a regex), Metaspace's split on its replacement character
  std::string literal;
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // Metaspace
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
  // Digits
  bool individual_digits = false;
};

class TextPipeline {
 public:
  // `normalizer` and `pre_tokenizer` are tokenizer.json's objects (null when absent).
  static absl::StatusOr<TextPipeline> Create(const nlohmann::json& normalizer,
                                             const nlohmann::json& pre_tokenizer);

  // Normalizes one piece of text in place (the pieces between added tokens are normalized one
  // at a time, as the tokenizers library does).
  absl::Status Normalize(std::string* text) const;
  // Splits normalized pieces into the words the model tokenizes.
  absl::StatusOr<std::vector<TextPiece>> PreTokenize(std::vector<TextPiece> pieces) const;

  bool has_normalizer() const { return !normalizer_.empty(); }

 private:
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
};

}  // namespace moeserve
