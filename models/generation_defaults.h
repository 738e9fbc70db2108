// A checkpoint's sampling defaults (generation_config.json), which vLLM applies to OpenAI API
// requests that do not set them (its --generation-config auto, the default): temperature, top_p,
// top_k, min_p and max_new_tokens (as max_tokens). repetition_penalty, which moeserve does not
// implement, is reported as not applied rather than ignored in silence.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve {

struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k, max_tokens;
  std::vector<std::string> not_applied;  // "repetition_penalty 1.05": set there, not implemented
  std::string source;                    // the file read; empty: none
  bool empty() const { return !temperature && !top_p && !min_p && !top_k && !max_tokens; }
  std::string Describe() const;  // for the start-up log
};

// `flag` as vLLM's --generation-config: "auto" reads `model_dir`'s generation_config.json (none
// for a preset, or a directory without one), "vllm" none, anything else a directory holding one
// (which must exist). A value of the wrong type or range is refused naming the file and key.
absl::StatusOr<GenerationDefaults> ReadGenerationDefaults(const std::string& flag,
                                                          const std::string& model_dir);

}  // namespace moeserve
