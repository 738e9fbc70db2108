// Recursive-descent parser with Jinja's operator precedence (jinja2/parser.py): conditional,
// or, and, not, comparisons, + -, ~, * / // %, **, unary, then postfix (. [] ()) and filters
// and tests.
#include "models/jinja_parser.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "models/jinja_builtins.h"
#include "models/jinja_lexer.h"

namespace moeserve::jinja {
namespace {

using ExprPtr = std::unique_ptr<Expr>;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> Template() {
    ASSIGN_OR_RETURN(Body body, ParseBody({}));
    if (Peek().kind != Token::kEnd)
      return Error(absl::StrCat("unexpected {% ", Peek(1).text, " %}"));
    return body;
  }

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

  // Statements until one of `ends` ({% elif %}, {% endfor %}, ...), which is left unread.
  absl::StatusOr<Body> ParseBody(const std::set<std::string>& ends) {
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

  absl::Status Close() { return Expect(Token::kStmtClose, "", "%}"); }

  // After {%: one statement through its end tag (null for a pass-through {% generation %}).
  absl::StatusOr<std::unique_ptr<Node>> Statement() {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(std::string keyword, ExpectName());
    auto n = std::make_unique<Node>();
    n->line = line;
    if (keyword == "if") {
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
      RETURN_IF_ERROR(Close());
    } else if (keyword == "for") {
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
      RETURN_IF_ERROR(Close());
    } else if (keyword == "set") {
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
      RETURN_IF_ERROR(Close());
    } else if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::kBreak : Node::kContinue;
      RETURN_IF_ERROR(Close());
    } else if (keyword == "generation") {
      // transformers' marker of the assistant's tokens: rendering is unchanged.
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
    } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template line ", line, ": unexpected {% ", keyword, " %}"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template line ", line, ": {% ", keyword, " %} is not supported"));
    }
    return n;
  }

  ExprPtr Make(Expr::Kind kind, int line, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = Make(Expr::kBinary, a->line, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  absl::StatusOr<ExprPtr> Expression(bool with_condition = true) {
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
  absl::StatusOr<ExprPtr> Or() {
    ASSIGN_OR_RETURN(ExprPtr e, And());
    while (IsName("or")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr r, And());
      e = Binary("or", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> And() {
    ASSIGN_OR_RETURN(ExprPtr e, Not());
    while (IsName("and")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr r, Not());
      e = Binary("and", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(ExprPtr x, Not());
      auto e = Make(Expr::kUnary, line, "not");
      e->args.push_back(std::move(x));
      return e;
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
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
  absl::StatusOr<ExprPtr> Math1() {
    ASSIGN_OR_RETURN(ExprPtr e, Concat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(ExprPtr r, Concat());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Concat() {
    ASSIGN_OR_RETURN(ExprPtr e, Math2());
    while (IsOp("~")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr r, Math2());
      e = Binary("~", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Math2() {
    ASSIGN_OR_RETURN(ExprPtr e, Pow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(ExprPtr r, Pow());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Pow() {
    ASSIGN_OR_RETURN(ExprPtr e, Unary(true));
    while (IsOp("**")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr r, Unary(true));
      e = Binary("**", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Unary(bool with_filter) {
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

  absl::StatusOr<ExprPtr> Primary() {
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

  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
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
  absl::StatusOr<ExprPtr> Call(ExprPtr callee) {
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
  absl::Status Arguments(Expr* e) {
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

  absl::StatusOr<ExprPtr> FilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!IsKnownFilter(name))
          return Error(absl::StrCat("filter '", name, "' is not supported"));
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

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).Template();
}

}  // namespace moeserve::jinja
