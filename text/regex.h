// A compiled PCRE2 pattern (UTF-8, Unicode properties on), as tokenizer.json's Split and Replace
// use them; matching allocates its own match data, so one Regex serves many threads.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve {

class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(absl::string_view pattern);
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the successive non-overlapping matches in `s` (valid UTF-8).
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Find(absl::string_view s) const;

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

}  // namespace moeserve
