// The OpenAI-compatible HTTP API, served beside the gRPC API on the same engine with the same
// validation, API keys (Authorization: Bearer) and drain: POST /v1/completions and
// /v1/chat/completions (JSON or server-sent events), GET /v1/models, GET /health (503 while
// draining), GET /metrics (Prometheus text), POST /tokenize and /detokenize. Errors are OpenAI
// error objects. On server/http_server.h (libmicrohttpd: event loops, read timeouts, connection
// limits, the key checked before the body is read); a completion waits on the engine without
// holding a thread. At the drain's end every open stream gets an error event and [DONE].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "server/drain_gate.h"
#include "server/http_server.h"
#include "server/service.h"
#include "server/stream_encoder.h"

namespace moeserve::server {

struct HttpOptions {
  std::string listen = "127.0.0.1:8000";  // HOST:PORT; port 0 picks a free one; empty: off
  HttpServerOptions server;                // event loops, limits and timeouts (listen is set from above)
  // The model's ids in /v1/models and in requests' "model" (as vLLM's --served-model-name: the
  // first is the default a request without "model" gets); at least one.
  std::vector<std::string> served_model_names;
};

class OpenStreams;  // the completions in flight (http_completions.h)

class HttpApi {
 public:
  // Binds and starts serving; `gate` (shared with the gRPC service) counts completions in
  // flight and refuses new ones while draining.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(const HttpOptions& options, Engine* engine,
                                                        const ServiceOptions& service,
                                                        DrainGate* gate);
  ~HttpApi();  // ends what is still open (as EndOpenStreams), stops the server
  int port() const { return server_->port(); }
  // The drain's grace is over: every open event stream gets an error event and [DONE], then
  // ends; its request is cancelled.
  void EndOpenStreams(const std::string& why);

 private:
  HttpApi() = default;
  std::vector<HttpRoute> Routes();

  HttpOptions options_;
  Engine* engine_ = nullptr;
  ServiceOptions service_;
  DrainGate* gate_ = nullptr;
  std::shared_ptr<OpenStreams> streams_;
  std::unique_ptr<StreamEncoder> encoder_;  // turns engine events into the answers' bytes
  std::unique_ptr<HttpServer> server_;  // last: stops before what its handlers use
};

}  // namespace moeserve::server
