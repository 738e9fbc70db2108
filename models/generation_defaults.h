// A checkpoint's sampling defaults (generation_config.json), which vLLM applies to OpenAI API
// requests that do not set them (its --generation-config auto, the default): temperature, top_p,
// top_k, min_p, repetition_penalty and max_new_tokens (as max_tokens).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve {

struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_tokens;
  std::string source;  // the file read; empty: none
  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens; }
  std::string Describe() const;  // for the start-up log
};

// `flag` as vLLM's --generation-config: "auto" reads `model_dir`'s generation_config.json (none
// for a preset, or a directory without one), "vllm" none, anything else a directory holding one
// (which must exist). A value of the wrong type or range is refused naming the file and key.
absl::StatusOr<GenerationDefaults> ReadGenerationDefaults(const std::string& flag,
                                                          const std::string& model_dir);

}  // namespace moeserve
