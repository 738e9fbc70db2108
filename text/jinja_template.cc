// The Jinja interpreter.
#include "text/jinja_template.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/jinja_builtins.h"
#include "text/jinja_helpers.h"
#include "text/jinja_parser.h"

namespace moeserve::jinja {
namespace {

constexpr int64_t kMaxSteps = 2'000'000;  // statements and iterations per render
constexpr size_t kMaxOutput = 64 << 20;   // bytes

enum class Flow { kNormal, kBreak, kContinue };

absl::Status At(int line, const absl::Status& s) {
  if (s.ok() || absl::StartsWith(s.message(), "chat template")) return s;
  return absl::Status(s.code(), absl::StrCat("chat template line ", line, ": ", s.message()));
}

class Interpreter {
 public:
  explicit Interpreter(Dict globals) {
    scopes_.push_back(std::move(globals));
    scopes_.emplace_back();
  }

  absl::StatusOr<std::string> Run(const Body& body) {
    ASSIGN_OR_RETURN(Flow f, Exec(body));
    (void)f;
    return std::move(out_);
  }

 private:
  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (const Value* v = it->Find(name)) return *v;
    }
    return Value::Undef(name);
  }

  absl::Status Step(int line) {
    if (++steps_ > kMaxSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template line ", line, ": more than ", kMaxSteps, " steps"));
    }
    if (out_.size() > kMaxOutput) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template line ", line, ": output over ", kMaxOutput, " bytes"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Body& body) {
    for (const auto& n : body) {
      ASSIGN_OR_RETURN(Flow f, Exec(*n));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> Exec(const Node& n) {
    RETURN_IF_ERROR(Step(n.line));
    switch (n.kind) {
      case Node::kText:
        out_ += n.text;
        return Flow::kNormal;
      case Node::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        out_ += v.ToString();
        return Flow::kNormal;
      }
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = cond == nullptr;
          if (!take) {
            ASSIGN_OR_RETURN(Value c, Eval(*cond));
            take = c.Truthy();
          }
          if (take) return Exec(body);
        }
        return Flow::kNormal;
      case Node::kFor:
        return ExecFor(n);
      case Node::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (!n.attr.empty()) {
          Value ns = Lookup(n.targets[0]);
          if (!ns.is_dict() || !ns.dict().is_namespace) {
            return At(n.line,
                      absl::InvalidArgumentError(absl::StrCat("cannot set .", n.attr, " on '",
                                                              n.targets[0], "': not a namespace")));
          }
          ns.dict().Set(n.attr, std::move(v));
          return Flow::kNormal;
        }
        return Bind(n.targets, v, n.line)
                   ? Flow::kNormal
                   : absl::StatusOr<Flow>(
                         At(n.line,
                            absl::InvalidArgumentError("cannot unpack the value into the names")));
      }
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // Assigns in the innermost scope; several names unpack a list of that length.
  bool Bind(const std::vector<std::string>& names, const Value& v, int) {
    if (names.size() == 1) {
      scopes_.back().Set(names[0], v);
      return true;
    }
    if (!v.is_list() || v.list().size() != names.size()) return false;
    for (size_t i = 0; i < names.size(); ++i) scopes_.back().Set(names[i], v.list()[i]);
    return true;
  }

  absl::StatusOr<Flow> ExecFor(const Node& n) {
    ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    absl::StatusOr<List> items = Iterate(seq);
    if (!items.ok()) return At(n.line, items.status());
    scopes_.emplace_back();
    List kept;
    if (n.filter != nullptr) {  // the inline "if" filters before loop.* is counted
      for (const Value& item : *items) {
        if (!Bind(n.targets, item, n.line))
          return At(n.line, absl::InvalidArgumentError("cannot unpack a loop item"));
        ASSIGN_OR_RETURN(Value keep, Eval(*n.filter));
        if (keep.Truthy()) kept.push_back(item);
      }
    } else {
      kept = *std::move(items);
    }
    const int64_t len = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < len; ++i) {
      RETURN_IF_ERROR(Step(n.line));
      scopes_.back() = Dict();
      if (!Bind(n.targets, kept[static_cast<size_t>(i)], n.line)) {
        return At(n.line, absl::InvalidArgumentError("cannot unpack a loop item"));
      }
      Dict loop;
      loop.Set("index", Value(i + 1));
      loop.Set("index0", Value(i));
      loop.Set("revindex", Value(len - i));
      loop.Set("revindex0", Value(len - i - 1));
      loop.Set("first", Value(i == 0));
      loop.Set("last", Value(i == len - 1));
      loop.Set("length", Value(len));
      loop.Set("previtem",
               i > 0 ? kept[static_cast<size_t>(i - 1)] : Value::Undef("loop.previtem"));
      loop.Set("nextitem",
               i + 1 < len ? kept[static_cast<size_t>(i + 1)] : Value::Undef("loop.nextitem"));
      scopes_.back().Set("loop", Value(std::move(loop)));
      ASSIGN_OR_RETURN(Flow f, Exec(n.body));
      if (f == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (len == 0 && !n.else_body.empty()) return Exec(n.else_body);
    return Flow::kNormal;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    absl::StatusOr<Value> v = EvalInner(e);
    if (!v.ok()) return At(e.line, v.status());
    return v;
  }

  absl::Status EvalAll(const Expr& e, size_t from, Args* args, Kwargs* kwargs) {
    for (size_t i = from; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args->push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*x));
      kwargs->emplace_back(k, std::move(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.value;
      case Expr::kName:
        return Lookup(e.name);
      case Expr::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (obj.is_undefined()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", obj.undefined_name(), "' is undefined (reading .", e.name, ")"));
        }
        if (obj.is_dict()) {
          const Value* v = obj.dict().Find(e.name);
          return v ? *v : Value::Undef(e.name);
        }
        return Value::Undef(e.name);
      }
      case Expr::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        if (obj.is_undefined()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", obj.undefined_name(), "' is undefined (subscripted)"));
        }
        if (obj.is_dict()) {
          const Value* v = key.is_string() ? obj.dict().Find(key.str()) : nullptr;
          return v ? *v : Value::Undef(key.ToString());
        }
        if ((obj.is_list() || obj.is_string()) && key.is_int()) {
          ASSIGN_OR_RETURN(List items, Iterate(obj));
          int64_t i = key.as_int();
          if (i < 0) i += static_cast<int64_t>(items.size());
          if (i < 0 || i >= static_cast<int64_t>(items.size()))
            return Value::Undef(absl::StrCat("[", key.as_int(), "]"));
          return items[static_cast<size_t>(i)];
        }
        return Value::Undef(key.ToString());
      }
      case Expr::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k + 1] != nullptr) {
            ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1]));
          }
        }
        if (!obj.is_list() && !obj.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat("cannot slice '", obj.TypeName(), "'"));
        }
        ASSIGN_OR_RETURN(List items, Iterate(obj));
        List out;
        for (size_t i :
             SliceIndices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2])) {
          out.push_back(items[i]);
        }
        if (obj.is_list()) return Value(std::move(out));
        std::string s;
        for (const Value& c : out) s += c.str();
        return Value(std::move(s));
      }
      case Expr::kCall: {
        const Expr& callee = *e.args[0];
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalAll(e, 1, &args, &kwargs));
        if (callee.kind == Expr::kName) return CallGlobal(callee.name, args, kwargs);
        ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
        return CallMethod(self, callee.name, args, kwargs);
      }
      case Expr::kFilter: {
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalAll(e, 1, &args, &kwargs));
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        return ApplyFilter(e.name, x, args, kwargs);
      }
      case Expr::kTest: {
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalAll(e, 1, &args, &kwargs));
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, x, args));
        return Value(r != e.negated);
      }
      case Expr::kUnary: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        if (e.name == "not") return Value(!x.Truthy());
        if (x.is_int()) return Value(e.name == "-" ? -x.as_int() : x.as_int());
        if (x.is_float()) return Value(e.name == "-" ? -x.as_number() : x.as_number());
        return absl::InvalidArgumentError(
            absl::StrCat("bad operand type for unary ", e.name, ": '", x.TypeName(), "'"));
      }
      case Expr::kBinary:
        return EvalBinary(e);
      case Expr::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args[2] == nullptr) return Value::Undef("conditional expression");
        return Eval(*e.args[2]);
      }
      case Expr::kList:
      case Expr::kTuple: {
        List out;
        for (const auto& x : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*x));
          out.push_back(std::move(v));
        }
        return Value(std::move(out));
      }
      case Expr::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return absl::InvalidArgumentError("dict keys must be strings");
          d.Set(k.str(), std::move(v));
        }
        return Value(std::move(d));
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    const std::string& op = e.name;
    ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    if (op == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.args[1]);
    ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "in" || op == "not in") {
      ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return Value(in == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      ASSIGN_OR_RETURN(bool less, op[0] == '<' ? a.Less(b) : b.Less(a));
      if (op.size() == 1) return Value(less);
      return Value(less || a.Equals(b));
    }
    if (op == "~") return Value(a.ToString() + b.ToString());
    return Arithmetic(op, a, b, kMaxOutput);
  }

  std::vector<Dict> scopes_;
  std::string out_;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Template>> Template::Parse(absl::string_view source) {
  // jinja2 drops one newline at the end of a template (keep_trailing_newline is off).
  if (absl::EndsWith(source, "\r\n")) {
    source.remove_suffix(2);
  } else if (absl::EndsWith(source, "\n")) {
    source.remove_suffix(1);
  }
  ASSIGN_OR_RETURN(Body body, jinja::Parse(source));
  auto t = std::shared_ptr<Template>(new Template());
  t->body_ = std::move(body);
  return t;
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  Value globals = Value::FromJson(context);
  if (!globals.is_dict())
    return absl::InvalidArgumentError("the chat template's context must be an object");
  return Interpreter(globals.dict()).Run(body_);
}

}  // namespace moeserve::jinja
