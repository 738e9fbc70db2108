// The expert-load file (see expert_load.h).
#include "parallel/expert_load.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"

namespace moeserve {

// A count's bound: far beyond any run, and small enough that a rank's sum of 65536 never
// overflows.
constexpr int64_t kMaxCount = 1000000000000000;

absl::StatusOr<ExpertLoad> ReadExpertLoad(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--expert-load: ", text.status().message()));
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("--expert-load \"", path, "\": ", what));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  auto count = [&](const char* key) -> int64_t {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : -1;
  };
  const int64_t layers = count("layers"), experts = count("experts");
  if (layers < 1 || layers > 4096) return bad("\"layers\" must be an integer in [1, 4096]");
  if (experts < 1 || experts > 65536) return bad("\"experts\" must be an integer in [1, 65536]");
  const nlohmann::json& t = j.contains("tokens") ? j["tokens"] : nlohmann::json();
  if (!t.is_array() || static_cast<int64_t>(t.size()) != layers) {
    return bad(absl::StrCat("\"tokens\" must be ", layers, " rows (one per layer)"));
  }
  ExpertLoad load{layers, experts, {}};
  for (int64_t l = 0; l < layers; ++l) {
    const nlohmann::json& row = t[static_cast<size_t>(l)];
    if (!row.is_array() || static_cast<int64_t>(row.size()) != experts) {
      return bad(absl::StrCat("\"tokens\"[", l, "] must hold ", experts, " counts"));
    }
    for (const nlohmann::json& v : row) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCount) {
        return bad(absl::StrCat("\"tokens\"[", l, "]: every count must be an integer in [0, 1e15]"));
      }
      load.tokens.push_back(v.get<int64_t>());
    }
  }
  return load;
}

std::string ExpertLoadJson(const ExpertLoad& load, const std::string& model) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t l = 0; l < load.layers; ++l) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t e = 0; e < load.experts; ++e) row.push_back(load.at(l, e));
    rows.push_back(std::move(row));
  }
  const nlohmann::json j = {{"model", model}, {"layers", load.layers}, {"experts", load.experts}, {"tokens", rows}};
  return j.dump() + "\n";
}

}  // namespace moeserve
