// generation_config.json's sampling defaults (see generation_defaults.h).
#include "models/generation_defaults.h"

#include <filesystem>
#include <tuple>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/status.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

absl::Status Bad(const std::string& file, const char* key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", key, " ", what));
}

absl::StatusOr<std::optional<double>> Number(const Json& j, const std::string& file, const char* key,
                                             double lo, double hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(file, key, "must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) return Bad(file, key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<GenerationDefaults> FromFile(const std::string& file) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  GenerationDefaults d;
  d.source = file;
  ASSIGN_OR_RETURN(d.temperature, Number(j, file, "temperature", 0, 100));  // a request's range
  ASSIGN_OR_RETURN(d.top_p, Number(j, file, "top_p", 1e-9, 1));
  ASSIGN_OR_RETURN(d.min_p, Number(j, file, "min_p", 0, 1));
  ASSIGN_OR_RETURN(d.repetition_penalty, Number(j, file, "repetition_penalty", 1e-9, 100));
  for (const auto& [key, lo, target] : {std::tuple{"top_k", -1.0, &d.top_k}, std::tuple{"max_new_tokens", 1.0, &d.max_tokens}}) {
    ASSIGN_OR_RETURN(const std::optional<double> v, Number(j, file, key, lo, 2147483647.0));
    if (v && *v != static_cast<double>(static_cast<int64_t>(*v))) return Bad(file, key, "must be an integer");
    if (v) *target = static_cast<int64_t>(*v);
  }
  if (d.top_k && *d.top_k <= 0) d.top_k.reset();  // -1 or 0: off, as the request default
  return d;
}

}  // namespace

std::string GenerationDefaults::Describe() const {
  std::vector<std::string> parts;
  if (temperature) parts.push_back(absl::StrCat("temperature ", *temperature));
  if (top_p) parts.push_back(absl::StrCat("top_p ", *top_p));
  if (min_p) parts.push_back(absl::StrCat("min_p ", *min_p));
  if (repetition_penalty) parts.push_back(absl::StrCat("repetition_penalty ", *repetition_penalty));
  if (top_k) parts.push_back(absl::StrCat("top_k ", *top_k));
  if (max_tokens) parts.push_back(absl::StrCat("max_tokens ", *max_tokens));
  return parts.empty() ? std::string("no sampling defaults")
                       : absl::StrCat("request defaults ", absl::StrJoin(parts, ", "));
}

absl::StatusOr<GenerationDefaults> ReadGenerationDefaults(const std::string& flag,
                                                          const std::string& model_dir) {
  if (flag == "vllm") return GenerationDefaults();
  if (flag == "auto") {
    if (model_dir.empty()) return GenerationDefaults();
    const fs::path file = fs::path(model_dir) / "generation_config.json";
    if (!fs::exists(file)) return GenerationDefaults();
    return FromFile(file.string());
  }
  const fs::path file = fs::path(flag) / "generation_config.json";
  if (!fs::exists(file)) {
    return absl::InvalidArgumentError(absl::StrCat("--generation-config ", flag,
                                                   ": no generation_config.json there (auto, vllm or a directory)"));
  }
  return FromFile(file.string());
}

}  // namespace moeserve
