// A chat template: the subset of Jinja that Hugging Face chat templates use, rendered as
// transformers' apply_chat_template does (trim_blocks, lstrip_blocks, loop controls, the
// {% generation %} marker, raise_exception, strftime_now). Statements: if/elif/else, for (with
// an inline if, else, loop.*, break, continue, tuple targets), set (names, tuples, namespace
// attributes). Expressions: literals, lists, dicts, attributes, subscripts and slices, Python's
// operators, conditional expressions, the filters, tests and methods of jinja_builtins.h.
// Anything else is refused when parsed, naming it and its line; the tests compare renderings
// with Python's jinja2 on real templates.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "text/jinja_ast.h"

namespace moeserve::jinja {

class Template {
 public:
  static absl::StatusOr<std::shared_ptr<const Template>> Parse(absl::string_view source);
  // Renders with the context's keys as global variables (messages, add_generation_prompt,
  // bos_token, ...). Errors (a raise_exception, a type error) name the line.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  Body body_;
};

}  // namespace moeserve::jinja
