// UTF-8 characters as the tokenizers library sees them: their classes (Rust's char predicates),
// Unicode normalization forms (utf8proc), and GPT-2's byte-level alphabet.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve {

// The character at s[i] (valid UTF-8): its byte length, and whether Rust's char::is_whitespace
// and char::is_alphanumeric hold for it (the tokenizers library's tests for spaces and words).
struct CharInfo {
  size_t len;
  bool space, alnum;
};
CharInfo CharAt(absl::string_view s, size_t i);
// Start of the character whose last byte is s[end - 1].
size_t PrevCharStart(absl::string_view s, size_t end);

// GPT-2's map of the 256 byte values to printable characters (UTF-8), which byte-level BPE
// vocabularies are written in.
const std::vector<std::string>& ByteLevelAlphabet();

// `s` mapped by utf8proc with `options` (UTF8PROC_COMPOSE | UTF8PROC_STABLE for NFC, ...).
absl::StatusOr<std::string> UnicodeNormalize(const std::string& s, int options);

}  // namespace moeserve
