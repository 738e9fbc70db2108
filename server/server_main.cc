// Server start-up, signals and graceful shutdown.
#include "server/server_main.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>

#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/status.h"
#include "server/drain_gate.h"

namespace moeserve::server {
namespace {

// Not a signal: the byte the engine's failure callback writes into the pipe.
constexpr char kEngineFailed = 'F';

// A signal handler can only reach globals: this is the write end of the self-pipe that turns
// SIGTERM/SIGINT into a byte the shutdown thread reads. (Blocking the signals instead is not
// enough: libraries such as OpenBLAS start threads before main, and those would take them.)
std::atomic<int> g_signal_pipe{-1};

extern "C" void OnShutdownSignal(int sig) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  const int fd = g_signal_pipe.load();
  const char c = static_cast<char>(sig);
  if (fd >= 0) (void)!write(fd, &c, 1);
  errno = saved_errno;
}

void SetShutdownHandler(void (*handler)(int)) {
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Installs the handlers for as long as it lives; Wait() returns the first signal caught.
class SignalPipe {
 public:
  SignalPipe() {
    if (pipe(fds_) != 0) {
      fds_[0] = fds_[1] = -1;
      return;
    }
    g_signal_pipe.store(fds_[1]);
    SetShutdownHandler(OnShutdownSignal);
  }
  ~SignalPipe() {
    SetShutdownHandler(SIG_DFL);
    g_signal_pipe.store(-1);
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  bool ok() const { return fds_[0] >= 0; }
  // Wakes Wait() with `c` as if a signal had arrived (kEngineFailed: the engine failed).
  void Notify(char c) { (void)!write(fds_[1], &c, 1); }
  int Wait() {
    char c = 0;
    while (read(fds_[0], &c, 1) < 0 && errno == EINTR) {
    }
    return c;
  }

 private:
  int fds_[2];
};

// TLS from --tls-cert and --tls-key (both or neither), else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) return grpc::InsecureServerCredentials();
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  auto cert = ReadFileToString(options.tls_cert);
  if (!cert.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", cert.status().message()));
  auto key = ReadFileToString(options.tls_key);
  if (!key.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-key: ", key.status().message()));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

// The gRPC server on --listen (its port in `port`); UNAVAILABLE naming who holds a taken port.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(const ServerOptions& options,
                                                        std::shared_ptr<grpc::ServerCredentials> creds,
                                                        MoeserveService* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, options.transport_metadata_bytes);
  // No SO_REUSEPORT: a second server on a taken port must fail, not share its traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server != nullptr && *port != 0) return server;
  int wanted = 0;
  const size_t colon = options.listen.rfind(':');
  const std::string holder = colon != std::string::npos && absl::SimpleAtoi(options.listen.substr(colon + 1), &wanted) && wanted > 0
                                 ? ProcessListeningOn(wanted)
                                 : "";
  return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", options.listen,
                                             holder.empty() ? "" : absl::StrCat(" (held by ", holder, ")")));
}

// The port files supervisors and tests wait for: HTTP's before gRPC's, then the metrics'.
absl::Status WritePortFiles(const ServerOptions& options, int port, const HttpApi* http) {
  auto write = [](const char* flag, const std::string& file, int value) -> absl::Status {
    if (file.empty()) return absl::OkStatus();
    absl::Status s = WriteFileAtomically(file, absl::StrCat(value, "\n"));
    return s.ok() ? s : absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
  };
  if (http != nullptr) RETURN_IF_ERROR(write("--http-port-file", options.http_port_file, http->port()));
  RETURN_IF_ERROR(write("--port-file", options.port_file, port));
  return write("--metrics-port-file", options.extra_port_file, options.extra_port);
}

// Waits for a shutdown signal or the engine's failure, then drains and shuts the server down.
void ShutDownOnSignal(const ServerOptions& options, SignalPipe* signal_pipe, Engine* engine, DrainGate* gate,
                      grpc::Server* server, HttpApi* http) {
  const int sig = signal_pipe->Wait();
  if (sig == kEngineFailed) {
    std::fprintf(stderr, "moeserve: engine failed: %s; not serving, stopping\n",
                 std::string(engine->failure().message()).c_str());
    gate->StartDraining();
    server->GetHealthCheckService()->SetServingStatus(false);
    // The streams have their final status already; give them a moment to deliver it.
    gate->WaitIdle(Clock::now() + std::chrono::seconds(2));
    server->Shutdown(std::chrono::system_clock::now());
    return;
  }
  std::fprintf(stderr, "moeserve: %s received, draining for up to %.1f s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               options.grace_seconds);
  if (options.on_shutdown_signal) options.on_shutdown_signal();
  // Refuse new streams (UNAVAILABLE) and tell health checkers, let the running ones finish
  // within the grace period, then shut down; calls still running are cancelled, and their
  // reactors cancel the engine requests, which frees their KV blocks.
  gate->StartDraining();
  server->GetHealthCheckService()->SetServingStatus(false);
  const bool idle = gate->WaitIdle(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(options.grace_seconds)));
  if (!idle) std::fprintf(stderr, "moeserve: grace period over, cancelling the requests still running\n");
  // Every HTTP stream still open ends with an error event and [DONE], not a cut connection.
  if (http != nullptr) http->EndOpenStreams("the server is shutting down: the drain's grace period is over");
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace

absl::Status RunServer(const ServerOptions& options, const ServiceOptions& service_options, Engine* engine) {
  // Both are process-wide switches of gRPC, set before the builder reads them.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  if (!std::isfinite(options.grace_seconds) || options.grace_seconds < 0 || options.grace_seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grace-seconds must be in [0, 86400], got ", options.grace_seconds));
  }
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-message-bytes must be >= 1024, got ", options.max_message_bytes));
  }
  // Catch the signals before anything can announce readiness (the port file), so that a signal
  // sent as soon as the server is up drains it instead of killing it.
  SignalPipe signal_pipe;
  if (!signal_pipe.ok()) return absl::InternalError("cannot create the signal pipe");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, Credentials(options));

  DrainGate gate;          // outlives the server, whose reactors leave it
  StreamEncoder encoder;   // outlives the server and the engine's last events (engine->Stop below)
  MoeserveService service(engine, service_options, &gate, &encoder);
  int port = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server, StartGrpc(options, creds, &service, &port));
  std::unique_ptr<HttpApi> http;
  if (!options.http.listen.empty()) {
    auto started = HttpApi::Start(options.http, engine, service_options, &gate);
    if (!started.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      return started.status();
    }
    http = *std::move(started);
    std::printf("moeserve: OpenAI-compatible HTTP API on http://%s:%d/v1 (model \"%s\")\n",
                options.http.listen.substr(0, options.http.listen.rfind(':')).c_str(), http->port(),
                absl::StrJoin(options.http.served_model_names, "\", \"").c_str());
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  std::printf("moeserve: listening on %s:%d%s\n", host.c_str(), port,
              service_options.api_keys.required()
                  ? absl::StrCat(" (api key required: ", service_options.api_keys.num_keys(), " key(s))").c_str()
                  : "");
  std::fflush(stdout);
  if (absl::Status s = WritePortFiles(options, port, http.get()); !s.ok()) {
    server->Shutdown(std::chrono::system_clock::now());
    return s;
  }

  // A failed engine (a rank of its MPI job lost) has ended its requests with UNAVAILABLE; the
  // server stops serving and RunServer returns the failure, so the job exits non-zero.
  engine->SetFailureCallback([&signal_pipe](const absl::Status&) { signal_pipe.Notify(kEngineFailed); });
  if (!engine->failure().ok()) signal_pipe.Notify(kEngineFailed);  // it failed before the server was up
  std::thread signals([&] { ShutDownOnSignal(options, &signal_pipe, engine, &gate, server.get(), http.get()); });
  server->Wait();
  signals.join();
  // Requests still running over HTTP end here (cancelled), so their threads can return.
  engine->Stop("server shutting down");
  engine->SetFailureCallback(nullptr);
  http.reset();
  if (absl::Status failed = engine->failure(); !failed.ok()) return failed;
  std::fprintf(stderr, "moeserve: stopped cleanly\n");
  return absl::OkStatus();
}

}  // namespace moeserve::server
