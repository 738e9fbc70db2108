// The OpenAI-compatible HTTP API, served beside the gRPC API on the same engine with the same
// validation, API keys (Authorization: Bearer) and drain: POST /v1/completions and
// /v1/chat/completions (JSON or server-sent events), GET /v1/models, GET /health (503 while
// draining), GET /metrics (Prometheus text), POST /tokenize and /detokenize. Errors are OpenAI
// error objects. On cpp-httplib (Debian's libcpp-httplib-dev): a listener thread and a pool of
// handler threads, each holding one request (a stream occupies its thread until it ends).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "server/drain_gate.h"
#include "server/service.h"

namespace httplib {
class Server;
}

namespace moeserve::server {

struct HttpOptions {
  std::string listen = "127.0.0.1:8000";  // HOST:PORT; port 0 picks a free one; empty: off
  int threads = 64;                       // concurrent requests (each stream holds one)
  size_t max_body_bytes = 4 << 20;
  std::string served_model_name;  // the model's id in /v1/models and in requests' "model"
};

class HttpApi {
 public:
  // Binds and starts serving; `gate` (shared with the gRPC service) counts completions in
  // flight and refuses new ones while draining.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(const HttpOptions& options, Engine* engine,
                                                        const ServiceOptions& service,
                                                        DrainGate* gate);
  ~HttpApi();  // stops accepting and joins
  int port() const { return port_; }

 private:
  HttpApi() = default;
  void Routes();

  HttpOptions options_;
  Engine* engine_ = nullptr;
  ServiceOptions service_;
  DrainGate* gate_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace moeserve::server
