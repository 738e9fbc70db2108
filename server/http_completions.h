// Runs an OpenAI completion on the engine for the HTTP API: the whole response at the end, or
// server-sent events as tokens arrive (a chunk per step, text only in whole UTF-8 characters,
// held back where it could be the start of a stop string), ending in "data: [DONE]". A client
// that goes away cancels the request: its KV blocks are free within a step.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"
#include "server/stream_encoder.h"

namespace moeserve::server {

class Completion;

// The completions in flight, so that the drain's end can close each with an error event.
class OpenStreams {
 public:
  void Add(const std::shared_ptr<Completion>& c);
  void EndAll(const std::string& why);

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Completion>> open_;
};

// Submits `p` and answers on `reply`: JSON when the request ends, or an event stream as tokens
// come (built on `encoder`'s thread, never the engine's). `on_end` runs once when the request
// has ended in the engine.
void RunCompletion(Engine* engine, StreamEncoder* encoder, OpenStreams* streams, ParsedCompletion p,
                   std::shared_ptr<HttpReply> reply, std::function<void()> on_end);

}  // namespace moeserve::server
