// Jinja tokenizer.
#include "text/jinja_lexer.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace moeserve::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

class Lexer {
 public:
  explicit Lexer(absl::string_view src) : src_(src) {}

  absl::StatusOr<std::vector<Token>> Run() {
    enum { kKeep, kAll, kNewline } strip_next = kKeep;
    while (pos_ < src_.size()) {
      size_t open = src_.find('{', pos_);
      while (open != absl::string_view::npos && open + 1 < src_.size() && src_[open + 1] != '{' &&
             src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open + 1 >= src_.size()) open = absl::string_view::npos;
      std::string text(src_.substr(
          pos_, open == absl::string_view::npos ? absl::string_view::npos : open - pos_));
      size_t data_start = pos_;  // where `text` begins in the source, after stripping
      if (strip_next == kAll) {
        size_t i = 0;
        while (i < text.size() && IsSpace(text[i])) ++i;
        text.erase(0, i);
        data_start += i;
      } else if (strip_next == kNewline) {
        const size_t n = text.rfind("\r\n", 0) == 0           ? 2
                         : (!text.empty() && text[0] == '\n') ? 1
                                                              : 0;
        text.erase(0, n);
        data_start += n;
      }
      strip_next = kKeep;
      if (open == absl::string_view::npos) {
        Emit(Token::kText, std::move(text));
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: blanks between the line's start and a block or comment tag go.
        const size_t nl = text.rfind('\n');
        const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
        const bool line_starting = data_start == 0 || src_[data_start - 1] == '\n';
        if (nl != std::string::npos || line_starting) {
          if (text.find_first_not_of(" \t", line_start) == std::string::npos)
            text.resize(line_start);
        }
      }
      CountLines(src_.substr(pos_, open - pos_));
      Emit(Token::kText, std::move(text));
      pos_ = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == absl::string_view::npos) return Error(line_, "unterminated comment");
        const bool minus = end > pos_ && src_[end - 1] == '-';
        CountLines(src_.substr(pos_, end + 2 - pos_));
        pos_ = end + 2;
        strip_next = minus ? kAll : kNewline;
        continue;
      }
      const bool stmt = kind == '%';
      Emit(stmt ? Token::kStmtOpen : Token::kExprOpen, "");
      bool minus = false;
      if (absl::Status s = Inside(stmt ? '%' : '}', &minus); !s.ok()) return s;
      Emit(stmt ? Token::kStmtClose : Token::kExprClose, "");
      strip_next = minus ? kAll : (stmt ? kNewline : kKeep);
    }
    Emit(Token::kEnd, "");
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Kind kind, std::string text) {
    if (kind == Token::kText && text.empty()) return;
    tokens_.push_back(Token{kind, std::move(text), line_});
  }
  void CountLines(absl::string_view s) {
    for (char c : s) line_ += c == '\n';
  }

  // Tokens up to the closing delimiter (`%}` or `}}`, maybe after `-`).
  absl::Status Inside(char closer, bool* minus) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) return Error(line_, "unterminated tag");
      const absl::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        const std::string close = closer == '%' ? "%}" : "}}";
        if (rest.substr(0, 3) == "-" + close) {
          *minus = true;
          pos_ += 3;
          return absl::OkStatus();
        }
        if (rest.substr(0, 2) == close) {
          pos_ += 2;
          return absl::OkStatus();
        }
      }
      const char c = rest[0];
      if (c == '\'' || c == '"') {
        std::string value;
        size_t i = 1;
        for (; i < rest.size() && rest[i] != c; ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size()) {
            const char e = rest[++i];
            switch (e) {
              case 'n':
                value += '\n';
                break;
              case 't':
                value += '\t';
                break;
              case 'r':
                value += '\r';
                break;
              case '\\':
                value += '\\';
                break;
              case '\'':
                value += '\'';
                break;
              case '"':
                value += '"';
                break;
              case '\n':
                break;
              default:
                value += '\\';
                value += e;
            }
          } else {
            line_ += rest[i] == '\n';
            value += rest[i];
          }
        }
        if (i >= rest.size()) return Error(line_, "unterminated string");
        Emit(Token::kString, std::move(value));
        pos_ += i + 1;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t i = 0;
        bool is_float = false;
        while (i < rest.size() &&
               (std::isdigit(static_cast<unsigned char>(rest[i])) || rest[i] == '_'))
          ++i;
        if (i + 1 < rest.size() && rest[i] == '.' &&
            std::isdigit(static_cast<unsigned char>(rest[i + 1]))) {
          is_float = true;
          ++i;
          while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) ++i;
        }
        std::string num(rest.substr(0, i));
        std::erase(num, '_');
        Emit(is_float ? Token::kFloat : Token::kInt, std::move(num));
        pos_ += i;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t i = 0;
        while (i < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[i])) || rest[i] == '_'))
          ++i;
        Emit(Token::kName, std::string(rest.substr(0, i)));
        pos_ += i;
      } else {
        static constexpr const char* kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* two : kTwo) {
          if (rest.substr(0, 2) == two) op = two;
        }
        if (op.size() == 1 && std::string("+-*/%~<>=()[]{}.,:|!").find(c) == std::string::npos) {
          return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        Emit(Token::kOp, op);
        pos_ += op.size();
      }
    }
  }

  absl::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace moeserve::jinja
