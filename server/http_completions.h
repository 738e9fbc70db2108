// Runs an OpenAI completion on the engine for the HTTP API: the whole response at the end, or
// server-sent events as tokens arrive (a chunk per step, text only in whole UTF-8 characters,
// held back where it could be the start of a stop string), ending in "data: [DONE]". A client
// that goes away mid-stream cancels the request: its KV blocks are free within a step.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/openai_protocol.h"

namespace moeserve::server {

// Submits `p` and fills `res`: JSON, or an event stream. `on_end` runs once when the request has
// ended and its response is complete (or abandoned).
void RunCompletion(Engine* engine, ParsedCompletion p, httplib::Response& res,
                   std::function<void()> on_end);

}  // namespace moeserve::server
