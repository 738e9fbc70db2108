// The chat-template parser's expressions, with Jinja's operator precedence
// (jinja2/parser.py): conditional, or, and, not, comparisons, + -, ~, * / // %, **, unary, then
// postfix (. [] ()) and filters and tests.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/jinja_builtins.h"
#include "text/jinja_parser_class.h"

namespace moeserve::jinja {

ExprPtr Parser::Make(Expr::Kind kind, int line, std::string name) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  e->name = std::move(name);
  return e;
}

ExprPtr Parser::Binary(std::string op, ExprPtr a, ExprPtr b) {
  auto e = Make(Expr::kBinary, a->line, std::move(op));
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}

absl::StatusOr<ExprPtr> Parser::Expression(bool with_condition) {
  ASSIGN_OR_RETURN(ExprPtr e, Or());
  if (!with_condition || !IsName("if")) return e;
  Next();
  auto c = Make(Expr::kCond, e->line);
  ASSIGN_OR_RETURN(ExprPtr cond, Or());
  ExprPtr other;
  if (IsName("else")) {
    Next();
    ASSIGN_OR_RETURN(other, Expression());
  }
  c->args.push_back(std::move(e));
  c->args.push_back(std::move(cond));
  c->args.push_back(std::move(other));
  return c;
}

absl::StatusOr<ExprPtr> Parser::Or() {
  ASSIGN_OR_RETURN(ExprPtr e, And());
  while (IsName("or")) {
    Next();
    ASSIGN_OR_RETURN(ExprPtr r, And());
    e = Binary("or", std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::And() {
  ASSIGN_OR_RETURN(ExprPtr e, Not());
  while (IsName("and")) {
    Next();
    ASSIGN_OR_RETURN(ExprPtr r, Not());
    e = Binary("and", std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Not() {
  if (IsName("not")) {
    const int line = Next().line;
    ASSIGN_OR_RETURN(ExprPtr x, Not());
    auto e = Make(Expr::kUnary, line, "not");
    e->args.push_back(std::move(x));
    return e;
  }
  return Compare();
}

absl::StatusOr<ExprPtr> Parser::Compare() {
  ASSIGN_OR_RETURN(ExprPtr e, Math1());
  while (true) {
    std::string op;
    if (Peek().kind == Token::kOp &&
        (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
         Peek().text == "<=" || Peek().text == ">=")) {
      op = Next().text;
    } else if (IsName("in")) {
      Next();
      op = "in";
    } else if (IsName("not") && IsName("in", 1)) {
      Next();
      Next();
      op = "not in";
    } else {
      return e;
    }
    ASSIGN_OR_RETURN(ExprPtr r, Math1());
    e = Binary(op, std::move(e), std::move(r));
  }
}

absl::StatusOr<ExprPtr> Parser::Math1() {
  ASSIGN_OR_RETURN(ExprPtr e, Concat());
  while (IsOp("+") || IsOp("-")) {
    std::string op = Next().text;
    ASSIGN_OR_RETURN(ExprPtr r, Concat());
    e = Binary(op, std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Concat() {
  ASSIGN_OR_RETURN(ExprPtr e, Math2());
  while (IsOp("~")) {
    Next();
    ASSIGN_OR_RETURN(ExprPtr r, Math2());
    e = Binary("~", std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Math2() {
  ASSIGN_OR_RETURN(ExprPtr e, Pow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    std::string op = Next().text;
    ASSIGN_OR_RETURN(ExprPtr r, Pow());
    e = Binary(op, std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Pow() {
  ASSIGN_OR_RETURN(ExprPtr e, Unary(true));
  while (IsOp("**")) {
    Next();
    ASSIGN_OR_RETURN(ExprPtr r, Unary(true));
    e = Binary("**", std::move(e), std::move(r));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Unary(bool with_filter) {
  ExprPtr e;
  if (IsOp("-") || IsOp("+")) {
    const Token& t = Next();
    e = Make(Expr::kUnary, t.line, t.text);
    ASSIGN_OR_RETURN(ExprPtr x, Unary(false));
    e->args.push_back(std::move(x));
  } else {
    ASSIGN_OR_RETURN(e, Primary());
  }
  ASSIGN_OR_RETURN(e, Postfix(std::move(e)));
  if (!with_filter) return e;
  return FilterExpr(std::move(e));
}

absl::StatusOr<ExprPtr> Parser::Primary() {
  const Token& t = Peek();
  if (t.kind == Token::kName) {
    Next();
    auto e = Make(Expr::kLiteral, t.line);
    if (t.text == "true" || t.text == "True") {
      e->value = Value(true);
    } else if (t.text == "false" || t.text == "False") {
      e->value = Value(false);
    } else if (t.text == "none" || t.text == "None") {
      e->value = Value::None();
    } else {
      e = Make(Expr::kName, t.line, t.text);
    }
    return e;
  }
  if (t.kind == Token::kString) {
    std::string s;
    const int line = t.line;
    while (Peek().kind == Token::kString) s += Next().text;  // adjacent literals join
    auto e = Make(Expr::kLiteral, line);
    e->value = Value(std::move(s));
    return e;
  }
  if (t.kind == Token::kInt || t.kind == Token::kFloat) {
    Next();
    auto e = Make(Expr::kLiteral, t.line);
    if (t.kind == Token::kInt) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(t.text, &v))
        return Error(absl::StrCat("integer ", t.text, " is out of range"));
      e->value = Value(v);
    } else {
      double v = 0;
      (void)absl::SimpleAtod(t.text, &v);
      e->value = Value(v);
    }
    return e;
  }
  if (IsOp("(")) {
    const int line = Next().line;
    std::vector<ExprPtr> items;
    bool tuple = false;
    while (!IsOp(")")) {
      ASSIGN_OR_RETURN(ExprPtr x, Expression());
      items.push_back(std::move(x));
      if (!IsOp(",")) break;
      Next();
      tuple = true;
    }
    RETURN_IF_ERROR(Expect(Token::kOp, ")", "')'"));
    if (!tuple && items.size() == 1) return std::move(items[0]);
    auto e = Make(Expr::kTuple, line);
    e->args = std::move(items);
    return e;
  }
  if (IsOp("[") || IsOp("{")) {
    const bool dict = IsOp("{");
    const int line = Next().line;
    auto e = Make(dict ? Expr::kDict : Expr::kList, line);
    const char* close = dict ? "}" : "]";
    while (!IsOp(close)) {
      ASSIGN_OR_RETURN(ExprPtr x, Expression());
      e->args.push_back(std::move(x));
      if (dict) {
        RETURN_IF_ERROR(Expect(Token::kOp, ":", "':'"));
        ASSIGN_OR_RETURN(ExprPtr v, Expression());
        e->args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    RETURN_IF_ERROR(Expect(Token::kOp, close, absl::StrCat("'", close, "'")));
    return e;
  }
  return Error(absl::StrCat("unexpected '", t.text, "' in an expression"));
}

absl::StatusOr<ExprPtr> Parser::Postfix(ExprPtr e) {
  while (true) {
    if (IsOp(".")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      auto a = Make(Expr::kAttr, line, std::move(name));
      a->args.push_back(std::move(e));
      e = std::move(a);
    } else if (IsOp("[")) {
      const int line = Next().line;
      ExprPtr parts[3];
      int n = 0;
      bool slice = false;
      while (true) {
        if (!IsOp(":") && !IsOp("]")) {
          ASSIGN_OR_RETURN(parts[n], Expression());
        }
        if (IsOp(":") && n < 2) {
          Next();
          slice = true;
          ++n;
          continue;
        }
        break;
      }
      RETURN_IF_ERROR(Expect(Token::kOp, "]", "']'"));
      auto s = Make(slice ? Expr::kSlice : Expr::kItem, line);
      s->args.push_back(std::move(e));
      if (!slice && parts[0] == nullptr) return Error("empty subscript");
      for (int k = 0; k < (slice ? 3 : 1); ++k) s->args.push_back(std::move(parts[k]));
      e = std::move(s);
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(e, Call(std::move(e)));
    } else {
      return e;
    }
  }
}

// A call on `callee`: a global function or a method; anything else is refused.
absl::StatusOr<ExprPtr> Parser::Call(ExprPtr callee) {
  const int line = Peek().line;
  if (callee->kind == Expr::kName && !IsKnownGlobal(callee->name)) {
    return Error(absl::StrCat("function ", callee->name, "() is not supported"));
  }
  if (callee->kind == Expr::kAttr && !IsKnownMethod(callee->name)) {
    return Error(absl::StrCat("method .", callee->name, "() is not supported"));
  }
  if (callee->kind != Expr::kName && callee->kind != Expr::kAttr) {
    return Error("only functions and methods can be called");
  }
  auto c = Make(Expr::kCall, line);
  c->args.push_back(std::move(callee));
  RETURN_IF_ERROR(Arguments(c.get()));
  return c;
}

// "(" args ")" into e->args (after those already there) and e->kwargs.
absl::Status Parser::Arguments(Expr* e) {
  RETURN_IF_ERROR(Expect(Token::kOp, "(", "'('"));
  while (!IsOp(")")) {
    if (Peek().kind == Token::kName && IsOp("=", 1)) {
      std::string key = Next().text;
      Next();
      ASSIGN_OR_RETURN(ExprPtr v, Expression());
      e->kwargs.emplace_back(std::move(key), std::move(v));
    } else {
      if (!e->kwargs.empty()) return Error("a positional argument follows a keyword argument");
      ASSIGN_OR_RETURN(ExprPtr v, Expression());
      e->args.push_back(std::move(v));
    }
    if (!IsOp(",")) break;
    Next();
  }
  return Expect(Token::kOp, ")", "')'");
}

absl::StatusOr<ExprPtr> Parser::FilterExpr(ExprPtr e) {
  while (true) {
    if (IsOp("|")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (!IsKnownFilter(name)) return Error(absl::StrCat("filter '", name, "' is not supported"));
      auto f = Make(Expr::kFilter, line, std::move(name));
      f->args.push_back(std::move(e));
      if (IsOp("(")) RETURN_IF_ERROR(Arguments(f.get()));
      e = std::move(f);
    } else if (IsName("is")) {
      const int line = Next().line;
      bool negated = false;
      if (IsName("not")) {
        Next();
        negated = true;
      }
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (!IsKnownTest(name)) return Error(absl::StrCat("test 'is ", name, "' is not supported"));
      auto t = Make(Expr::kTest, line, std::move(name));
      t->negated = negated;
      t->args.push_back(std::move(e));
      if (IsOp("(")) {
        RETURN_IF_ERROR(Arguments(t.get()));
      } else if ((Peek().kind == Token::kString || Peek().kind == Token::kInt ||
                  Peek().kind == Token::kFloat || IsOp("[") || IsOp("{") ||
                  (Peek().kind == Token::kName && !IsName("else") && !IsName("or") &&
                   !IsName("and") && !IsName("if") && !IsName("in") && !IsName("is")))) {
        ASSIGN_OR_RETURN(ExprPtr arg, Primary());
        ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
        t->args.push_back(std::move(arg));
      }
      e = std::move(t);
    } else {
      return e;
    }
  }
}

}  // namespace moeserve::jinja
