// Recursive-descent parser for chat templates: the statements ({% if %}, {% for %}, {% set %},
// ...) and the template body; the expressions are in jinja_expressions.cc.
#include "text/jinja_parser.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser_class.h"

namespace moeserve::jinja {

absl::StatusOr<Body> Parser::Template() {
  ASSIGN_OR_RETURN(Body body, ParseBody({}));
  if (Peek().kind != Token::kEnd) return Error(absl::StrCat("unexpected {% ", Peek(1).text, " %}"));
  return body;
}

// Statements until one of `ends` ({% elif %}, {% endfor %}, ...), which is left unread.
absl::StatusOr<Body> Parser::ParseBody(const std::set<std::string>& ends) {
  Body body;
  while (true) {
    const Token& tok = Peek();
    if (tok.kind == Token::kEnd) {
      if (!ends.empty()) return Error(absl::StrCat("missing {% ", *ends.rbegin(), " %}"));
      return body;
    }
    if (tok.kind == Token::kText) {
      auto n = std::make_unique<Node>();
      n->kind = Node::kText;
      n->text = Next().text;
      body.push_back(std::move(n));
    } else if (tok.kind == Token::kExprOpen) {
      Next();
      auto n = std::make_unique<Node>();
      n->kind = Node::kOutput;
      n->line = tok.line;
      ASSIGN_OR_RETURN(n->expr, Expression());
      RETURN_IF_ERROR(Expect(Token::kExprClose, "", "}}"));
      body.push_back(std::move(n));
    } else if (tok.kind == Token::kStmtOpen) {
      if (Peek(1).kind == Token::kName && ends.count(Peek(1).text)) return body;
      Next();
      ASSIGN_OR_RETURN(auto n, Statement());
      if (n != nullptr) body.push_back(std::move(n));
    } else {
      return Error(absl::StrCat("unexpected '", tok.text, "'"));
    }
  }
}

// After {%: one statement through its end tag (null for a pass-through {% generation %}).
absl::Status Parser::IfStatement(Node* n) {
  n->kind = Node::kIf;
  ASSIGN_OR_RETURN(auto cond, Expression());
  RETURN_IF_ERROR(Close());
  while (true) {
    ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}));
    n->branches.emplace_back(std::move(cond), std::move(body));
    Next();  // {%
    const std::string end = Next().text;
    if (end == "endif") break;
    if (end == "else") {
      RETURN_IF_ERROR(Close());
      ASSIGN_OR_RETURN(Body rest, ParseBody({"endif"}));
      n->branches.emplace_back(nullptr, std::move(rest));
      Next();
      Next();
      break;
    }
    ASSIGN_OR_RETURN(cond, Expression());  // elif
    RETURN_IF_ERROR(Close());
  }
  return Close();
}

absl::Status Parser::ForStatement(Node* n) {
  n->kind = Node::kFor;
  do {
    ASSIGN_OR_RETURN(std::string target, ExpectName());
    n->targets.push_back(std::move(target));
  } while (IsOp(",") && (Next(), true));
  RETURN_IF_ERROR(Expect(Token::kName, "in", "'in'"));
  ASSIGN_OR_RETURN(n->expr, Expression(/*with_condition=*/false));
  if (IsName("if")) {
    Next();
    ASSIGN_OR_RETURN(n->filter, Expression(false));
  }
  if (IsName("recursive")) return Error("recursive loops are not supported");
  RETURN_IF_ERROR(Close());
  ASSIGN_OR_RETURN(n->body, ParseBody({"else", "endfor"}));
  Next();
  if (Next().text == "else") {
    RETURN_IF_ERROR(Close());
    ASSIGN_OR_RETURN(n->else_body, ParseBody({"endfor"}));
    Next();
    Next();
  }
  return Close();
}

absl::Status Parser::SetStatement(Node* n) {
  n->kind = Node::kSet;
  ASSIGN_OR_RETURN(std::string target, ExpectName());
  n->targets.push_back(std::move(target));
  if (IsOp(".")) {
    Next();
    ASSIGN_OR_RETURN(n->attr, ExpectName());
  } else {
    while (IsOp(",")) {
      Next();
      ASSIGN_OR_RETURN(std::string more, ExpectName());
      n->targets.push_back(std::move(more));
    }
  }
  if (!IsOp("=")) return Error("{% set %} blocks (without '=') are not supported");
  Next();
  ASSIGN_OR_RETURN(n->expr, Expression());
  return Close();
}

// transformers' marker of the assistant's tokens: rendering is unchanged (an always-true if).
absl::Status Parser::GenerationStatement(Node* n) {
  RETURN_IF_ERROR(Close());
  n->kind = Node::kIf;
  ASSIGN_OR_RETURN(Body body, ParseBody({"endgeneration"}));
  Next();
  Next();
  RETURN_IF_ERROR(Close());
  auto yes = std::make_unique<Expr>();
  yes->kind = Expr::kLiteral;
  yes->value = Value(true);
  n->branches.emplace_back(std::move(yes), std::move(body));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Node>> Parser::Statement() {
  const int line = Peek().line;
  ASSIGN_OR_RETURN(std::string keyword, ExpectName());
  auto n = std::make_unique<Node>();
  n->line = line;
  if (keyword == "if") {
    RETURN_IF_ERROR(IfStatement(n.get()));
  } else if (keyword == "for") {
    RETURN_IF_ERROR(ForStatement(n.get()));
  } else if (keyword == "set") {
    RETURN_IF_ERROR(SetStatement(n.get()));
  } else if (keyword == "break" || keyword == "continue") {
    n->kind = keyword == "break" ? Node::kBreak : Node::kContinue;
    RETURN_IF_ERROR(Close());
  } else if (keyword == "generation") {
    RETURN_IF_ERROR(GenerationStatement(n.get()));
  } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line, ": unexpected {% ", keyword, " %}"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line, ": {% ", keyword, " %} is not supported"));
  }
  return n;
}

absl::StatusOr<Body> Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).Template();
}

}  // namespace moeserve::jinja
