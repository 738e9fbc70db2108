// Maps a wire GenerateRequest onto the engine's request: the prompt (text through the model's
// tokenizer with its special tokens, or token ids), the proto3 defaults (max_tokens 0 means the limits'
// default, an unset top_p means 1), and the priority enum. The fields are then checked by the
// engine's one validator (engine/request_validation.h), with the prompt named as the client
// sent it ("text" or "token_ids"): INVALID_ARGUMENT naming the field and the limit.
#pragma once

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "engine/request_validation.h"
#include "models/model_config.h"
#include "text/model_tokenizer.h"
#include "server/proto/moeserve.pb.h"
#include "server/request_stream.h"

namespace moeserve::server {

// `text` receives the stop strings (request_stream.h), checked too.
absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& req,
                                                const ModelConfig& config,
                                                const RequestLimits& limits,
                                                const ModelTokenizer& tokenizer, TextOptions* text);

}  // namespace moeserve::server
