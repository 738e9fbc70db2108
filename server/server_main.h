// Runs the gRPC server until SIGTERM or SIGINT, then shuts down gracefully: stop accepting,
// let running requests finish within the grace period, cancel the rest, return.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "server/http_api.h"
#include "server/service.h"

namespace moeserve::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  std::string tls_cert;                    // PEM files; both set to enable TLS
  std::string tls_key;
  int max_message_bytes = 4 << 20;
  // gRPC 1.51's HPACK parser stops at its metadata limit and leaves the connection's header
  // table out of step, which ends every other stream on that connection; so the transport's
  // limit is set well above the service's own (ServiceOptions::max_metadata_bytes; serve uses 8x),
  // which refuses an oversized call alone. Beyond it, one call cannot be refused alone.
  int transport_metadata_bytes = 128 << 10;
  double grace_seconds = 10.0;
  std::string port_file;  // when set, the bound port is written here
  // Written with port_file, once the signal handlers are in place: another listener's port
  // (the Prometheus endpoint), so that a supervisor waiting on it can signal safely.
  std::string extra_port_file;
  int extra_port = 0;
  // The OpenAI-compatible HTTP API beside gRPC (http.listen empty: none), and where to write
  // its bound port.
  HttpOptions http;
  std::string http_port_file;
  // Called on SIGTERM/SIGINT before the drain begins (an MPI job watches its ranks more closely).
  std::function<void()> on_shutdown_signal;
};

// Serves `engine` (already started) until SIGTERM or SIGINT; then stops the engine. Installs its
// own handlers for those signals while it runs.
absl::Status RunServer(const ServerOptions& options, const ServiceOptions& service_options, Engine* engine);

}  // namespace moeserve::server
