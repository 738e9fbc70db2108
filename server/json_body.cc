// Bounded JSON parsing and checked integers for the request bodies.
#include "server/json_body.h"

#include "absl/strings/str_cat.h"

namespace moeserve::server {
namespace {

// One pass over the text outside strings: the deepest nesting and the number of values (each
// separator or opening bracket starts one more). Cheap next to the parse it guards.
absl::Status CheckShape(std::string_view body, const JsonLimits& limits) {
  int depth = 0;
  int64_t values = 1;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat("body: JSON nested deeper than ", limits.max_depth, " levels (the limit)"));
        }
        ++values;
        break;
      case ']':
      case '}': --depth; break;
      case ',':
        if (++values > limits.max_values) {
          return absl::InvalidArgumentError(
              absl::StrCat("body: more than ", limits.max_values, " JSON values (the limit)"));
        }
        break;
      default: break;
    }
  }
  return absl::OkStatus();
}

// Line and column (from 1) of byte offset `at`.
std::pair<int64_t, int64_t> LineColumn(std::string_view body, size_t at) {
  int64_t line = 1, column = 1;
  for (size_t i = 0; i < at && i < body.size(); ++i) {
    if (body[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body, const JsonLimits& limits) {
  if (absl::Status s = CheckShape(body, limits); !s.ok()) return s;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body.begin(), body.end());
  } catch (const nlohmann::json::parse_error& e) {
    const auto [line, column] = LineColumn(body, e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    if (const size_t at = what.find("syntax error"); at != std::string::npos) what = what.substr(at);
    return absl::InvalidArgumentError(absl::StrCat("body: not valid JSON at line ", line, ", column ", column, ": ", what));
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax the parser cannot hold, e.g. a number past double's range (1e400): an
    // exception escaping here would end the server.
    return absl::InvalidArgumentError(absl::StrCat("body: not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError("body: must be a JSON object");
  return j;
}

absl::StatusOr<int64_t> IntInRange(const nlohmann::json& v, const char* field, int64_t lo, int64_t hi) {
  auto bad = [&](const std::string& got) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be an integer in [", lo, ", ", hi, "], got ", got));
  };
  if (!v.is_number_integer()) return bad(v.dump());
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(u) > hi || static_cast<int64_t>(u) < lo) {
      return bad(absl::StrCat(u));
    }
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) return bad(absl::StrCat(i));
  return i;
}

absl::StatusOr<uint64_t> UnsignedInt(const nlohmann::json& v, const char* field) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be an integer in [0, 18446744073709551615], got ", v.dump()));
  }
  return v.get<uint64_t>();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const nlohmann::json& array, const char* field) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const nlohmann::json& v : array) {
    ASSIGN_OR_RETURN(const int64_t id, IntInRange(v, field, 0, std::numeric_limits<int32_t>::max()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

}  // namespace moeserve::server
