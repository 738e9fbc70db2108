// The chat-template parser's class (jinja_parser.cc: statements, jinja_expressions.cc: the
// expression grammar). Internal to models/: use jinja_parser.h's Parse.
#pragma once

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace moeserve::jinja {

using ExprPtr = std::unique_ptr<Expr>;

// Recursive descent over the lexer's tokens.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}
  // The whole template: statements up to the end of the input.
  absl::StatusOr<Body> Template();

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::kName && Peek(ahead).text == name;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", Peek().line, ": ", what));
  }
  absl::Status Expect(Token::Kind kind, absl::string_view text, absl::string_view what) {
    if (Peek().kind != kind || (!text.empty() && Peek().text != text)) {
      return Error(absl::StrCat("expected ", what, ", got '", Peek().text, "'"));
    }
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Token::kName)
      return Error(absl::StrCat("expected a name, got '", Peek().text, "'"));
    return Next().text;
  }
  absl::Status Close() { return Expect(Token::kStmtClose, "", "%}"); }

  // Statements until one of `ends` ({% elif %}, {% endfor %}, ...), which is left unread.
  absl::StatusOr<Body> ParseBody(const std::set<std::string>& ends);
  // After {%: one statement through its end tag (null for a pass-through {% generation %}).
  absl::StatusOr<std::unique_ptr<Node>> Statement();
  // The parts of the statements with a body, after their keyword: into `n`.
  absl::Status IfStatement(Node* n);
  absl::Status ForStatement(Node* n);
  absl::Status SetStatement(Node* n);
  absl::Status GenerationStatement(Node* n);
  ExprPtr Make(Expr::Kind kind, int line, std::string name = "");
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b);
  absl::StatusOr<ExprPtr> Expression(bool with_condition = true);
  absl::StatusOr<ExprPtr> Or();
  absl::StatusOr<ExprPtr> And();
  absl::StatusOr<ExprPtr> Not();
  absl::StatusOr<ExprPtr> Compare();
  absl::StatusOr<ExprPtr> Math1();
  absl::StatusOr<ExprPtr> Concat();
  absl::StatusOr<ExprPtr> Math2();
  absl::StatusOr<ExprPtr> Pow();
  absl::StatusOr<ExprPtr> Unary(bool with_filter);
  absl::StatusOr<ExprPtr> Primary();
  absl::StatusOr<ExprPtr> Postfix(ExprPtr e);
  // A call on `callee`: a global function or a method; anything else is refused.
  absl::StatusOr<ExprPtr> Call(ExprPtr callee);
  // "(" args ")" into e->args (after those already there) and e->kwargs.
  absl::Status Arguments(Expr* e);
  absl::StatusOr<ExprPtr> FilterExpr(ExprPtr e);

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace moeserve::jinja
