// Parses a chat template into statements (jinja_ast.h). What the subset does not implement is
// refused here, naming it and its line: another statement ({% macro %}, {% include %}, ...),
// or a filter, test, method or global function outside the lists in jinja_builtins.h.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja_ast.h"

namespace moeserve::jinja {

absl::StatusOr<Body> Parse(absl::string_view source);

}  // namespace moeserve::jinja
