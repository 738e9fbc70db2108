// Splits a Jinja template into tokens: literal text, the delimiters of {{ }} and {% %}, and the
// names, literals and operators inside them. Comments are dropped. Whitespace control is
// applied here as transformers renders chat templates: `-` strips all whitespace on that side,
// trim_blocks drops the newline after a block or comment tag, lstrip_blocks drops spaces and
// tabs before one on its line (`+` keeps them).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve::jinja {

struct Token {
  enum Kind {
    kText,
    kExprOpen,
    kExprClose,
    kStmtOpen,
    kStmtClose,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Kind kind;
  std::string text;  // the text, name, string value, number or operator
  int line = 1;
};

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace moeserve::jinja
