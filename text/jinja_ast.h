// The parsed form of a chat template: expressions and statements.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace moeserve::jinja {

struct Expr {
  enum Kind {
    kLiteral,  // value
    kName,     // name
    kAttr,     // a.name
    kItem,     // a[b]
    kSlice,    // a[b:c:d]; absent parts are null
    kCall,     // a(args, kwargs); a is a kName (a global) or a kAttr (a method)
    kFilter,   // args[0] | name(args[1:], kwargs)
    kTest,     // args[0] is [not] name(args[1:])
    kUnary,    // op args[0]: "-", "+", "not"
    kBinary,   // args[0] op args[1]: + - * / // % ** ~ == != < > <= >= in "not in" and or
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    kList,     // [args]
    kTuple,    // (args)
    kDict,     // {args[2i]: args[2i+1]}
  };
  Kind kind;
  int line = 0;
  std::string name;      // name, attribute, filter, test, or operator
  Value value;           // kLiteral
  bool negated = false;  // kTest: "is not"
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches: (condition, body)...; a null condition is the else
    kFor,     // for targets in expr [if filter]: body [else: else_body]
    kSet,     // set targets = expr, or set ns.attr = expr (attr set)
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::vector<std::pair<std::unique_ptr<Expr>, Body>> branches;
  std::vector<std::string> targets;  // loop variables or set names
  std::string attr;                  // kSet on a namespace: targets[0].attr
  std::unique_ptr<Expr> filter;      // kFor: the inline "if"
  Body body, else_body;
};

}  // namespace moeserve::jinja
