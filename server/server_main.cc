// Server start-up, signals and graceful shutdown.
#include "server/server_main.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"

namespace moeserve::server {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::Status RunServer(const ServerOptions& options, const ServiceOptions& service_options, Engine* engine) {
  // Both are process-wide switches of gRPC, set before the builder reads them.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options.tls_cert.empty() || !options.tls_key.empty()) {
    if (options.tls_cert.empty() || options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
    }
    auto cert = ReadFileToString(options.tls_cert);
    if (!cert.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", cert.status().message()));
    auto key = ReadFileToString(options.tls_key);
    if (!key.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-key: ", key.status().message()));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  MoeserveService service(engine, service_options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, creds, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  std::printf("moeserve: listening on %s:%d%s\n", host.c_str(), port,
              service_options.api_key.empty() ? "" : " (api key required)");
  std::fflush(stdout);
  if (!options.port_file.empty()) {
    absl::Status s = WriteFileAtomically(options.port_file, absl::StrCat(port, "\n"));
    if (!s.ok()) return s;
  }

  // The signal thread: wait for SIGTERM/SIGINT, then shut down with a grace period.
  std::thread signals([&] {
    sigset_t set = ShutdownSignals();
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "moeserve: %s received, draining for up to %.1f s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 options.grace_seconds);
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(options.grace_seconds));
    // Stops accepting; in-flight calls finish until the deadline, then are cancelled (their
    // reactors cancel the engine requests, which frees their KV blocks).
    server->Shutdown(deadline);
  });
  server->Wait();
  signals.join();
  engine->Stop("server shutting down");
  std::fprintf(stderr, "moeserve: stopped cleanly\n");
  return absl::OkStatus();
}

}  // namespace moeserve::server
