// Turns a wire GenerateRequest into an engine request, checking every field; errors are
// INVALID_ARGUMENT naming the field and the limit.
#pragma once

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "models/model_config.h"
#include "server/proto/moeserve.pb.h"

namespace moeserve::server {

struct ValidationLimits {
  int64_t max_tokens_limit = 4096;
  int64_t max_prompt_tokens = 0;  // 0: the model's context less one
  int64_t default_max_tokens = 16;
  double max_retain_seconds = 86400;
};

absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& req, const ModelConfig& config,
                                                const ValidationLimits& limits);

}  // namespace moeserve::server
