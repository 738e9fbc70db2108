// The HTTP server on libmicrohttpd: the listening socket, the per-request state machine
// (headers -> check -> body -> handler -> answer, suspending the connection while an answer is
// pending) and the read-timeout reaper.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/http_reply.h"

namespace moeserve::server {

using Clock = std::chrono::steady_clock;

std::string HttpRequest::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

// One request on a connection: MHD's per-request context.
struct HttpServer::Exchange {
  HttpRequest req;
  const HttpRoute* route = nullptr;
  bool answered = false;    // a response was queued (an early refusal, or the handler's)
  bool dispatched = false;  // the handler has the request
  bool over_limit = false;  // the body crossed the limit (discarded; a 413 at its end)
  std::shared_ptr<ReplyState> reply;
};

struct HttpServer::Impl {
  HttpServerOptions options;
  std::vector<HttpRoute> routes;
  MHD_Daemon* daemon = nullptr;
  int listen_fd = -1;
  std::atomic<bool> stopping{false};

  // Connections and what they wait for, for the reaper (read timeouts).
  struct Conn {
    int fd = -1;
    Clock::time_point deadline;  // closed if still in its read phase past this
    bool reading = true;         // waiting for headers or body (false: the handler or the answer)
  };
  std::mutex mu;
  std::unordered_map<MHD_Connection*, Conn> conns;
  std::vector<std::weak_ptr<ReplyState>> replies;  // answers in flight (resumed at shutdown)
  std::condition_variable reaper_cv;
  std::thread reaper;

  void SetReading(MHD_Connection* c, bool reading, int seconds) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = conns.find(c);
    if (it == conns.end()) return;
    it->second.reading = reading;
    it->second.deadline = Clock::now() + std::chrono::seconds(seconds);
  }
  void ReapLoop();
  const HttpRoute* Find(const std::string& method, const std::string& path, bool* path_known) const;
  void Refuse(MHD_Connection* c, Exchange* ex, int status, const std::string& message);
  MHD_Result Answer(MHD_Connection* c, Exchange* ex);
};

namespace {

MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(cls);
  std::string name(key);
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  (*headers)[name] = value != nullptr ? value : "";
  return MHD_YES;
}

std::string ClientAddress(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr || info->client_addr->sa_family != AF_INET) return "";
  char buf[INET_ADDRSTRLEN] = {0};
  const auto* in = reinterpret_cast<const sockaddr_in*>(info->client_addr);
  inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace

const HttpRoute* HttpServer::Impl::Find(const std::string& method, const std::string& path, bool* path_known) const {
  *path_known = false;
  for (const HttpRoute& r : routes) {
    if (r.path != path) continue;
    *path_known = true;
    if (r.method == method) return &r;
  }
  return nullptr;
}

void HttpServer::Impl::Refuse(MHD_Connection* c, Exchange* ex, int status, const std::string& message) {
  ex->reply->Send(status, "application/json", options.error_body(status, message), {});
  ex->answered = true;
  ex->reply->QueueOrSuspend(c, /*closing=*/true);
}

// Queues the handler's answer if there is one; otherwise waits for it with the connection
// suspended (Send/StartStream resume it, and this runs again).
MHD_Result HttpServer::Impl::Answer(MHD_Connection* c, Exchange* ex) {
  if (stopping.load()) ex->reply->Abandon();  // nothing more will come: a 503 if nothing came
  if (ex->reply->QueueOrSuspend(c, /*closing=*/false)) ex->answered = true;
  return MHD_YES;
}

namespace {

MHD_Result OnRequest(void* cls, MHD_Connection* c, const char* url, const char* method, const char* version,
                     const char* upload_data, size_t* upload_data_size, void** con_cls) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto* ex = static_cast<HttpServer::Exchange*>(*con_cls);
  if (ex == nullptr) {  // the headers are in; no body byte has been read yet
    ex = new HttpServer::Exchange();
    *con_cls = ex;
    ex->reply = std::make_shared<ReplyState>();
    ex->req.method = method;
    ex->req.path = url;
    ex->req.version = version;
    ex->req.client = ClientAddress(c);
    MHD_get_connection_values(c, MHD_HEADER_KIND, CollectHeader, &ex->req.headers);
    impl->SetReading(c, true, impl->options.body_timeout_seconds);
    bool path_known = false;
    ex->route = impl->Find(ex->req.method, ex->req.path, &path_known);
    if (ex->route == nullptr) {
      impl->Refuse(c, ex, path_known ? 405 : 404, absl::StrCat("no route ", ex->req.method, " ", ex->req.path));
      return MHD_YES;
    }
    uint64_t length = 0;
    const std::string declared = ex->req.Header("content-length");
    if (!declared.empty() && absl::SimpleAtoi(declared, &length) && length > impl->options.max_body_bytes) {
      impl->Refuse(c, ex, 413, absl::StrCat("body: ", length, " bytes, over the limit of ",
                                            impl->options.max_body_bytes, " bytes"));
      return MHD_YES;
    }
    if (ex->route->check && !ex->route->check(ex->req, *ex->reply)) {
      ex->answered = true;
      ex->reply->QueueOrSuspend(c, /*closing=*/true);
    }
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    if (!ex->answered && !ex->over_limit) {
      if (ex->req.body.size() + *upload_data_size > impl->options.max_body_bytes) {
        // libmicrohttpd takes an answer only before the body or after all of it: the rest is
        // discarded as it comes, and the 413 goes out when the body ends (or the body timeout
        // closes a client that never ends it).
        ex->over_limit = true;
        ex->req.body.clear();
        ex->req.body.shrink_to_fit();
      } else {
        ex->req.body.append(upload_data, *upload_data_size);
      }
    }
    *upload_data_size = 0;  // consumed, or discarded
    return MHD_YES;
  }
  if (ex->answered) return MHD_YES;
  if (ex->over_limit) {
    impl->Refuse(c, ex, 413, absl::StrCat("body: over the limit of ", impl->options.max_body_bytes, " bytes"));
    return MHD_YES;
  }
  if (!ex->dispatched) {
    ex->dispatched = true;
    impl->SetReading(c, false, 0);
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      if (impl->replies.size() > 4096) {  // forget the answers that are done
        std::erase_if(impl->replies, [](const std::weak_ptr<ReplyState>& w) { return w.expired(); });
      }
      impl->replies.push_back(ex->reply);
    }
    ex->route->handle(ex->req, ex->reply);
  }
  return impl->Answer(c, ex);
}

void OnCompleted(void* cls, MHD_Connection* c, void** con_cls, MHD_RequestTerminationCode toe) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto* ex = static_cast<HttpServer::Exchange*>(*con_cls);
  *con_cls = nullptr;
  // Back to reading: the next request's headers on a kept-alive connection, within the idle time.
  impl->SetReading(c, true, impl->options.idle_timeout_seconds);
  if (ex == nullptr) return;
  ex->reply->Closed(toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
  delete ex;
}

void OnConnection(void* cls, MHD_Connection* c, void**, MHD_ConnectionNotificationCode code) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  std::lock_guard<std::mutex> lock(impl->mu);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    impl->conns.erase(c);  // before MHD closes the descriptor: the reaper never touches a reused one
    return;
  }
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  HttpServer::Impl::Conn conn;
  conn.fd = info != nullptr ? info->connect_fd : -1;
  conn.deadline = Clock::now() + std::chrono::seconds(impl->options.header_timeout_seconds);
  impl->conns[c] = conn;
}

// The listening socket: SO_REUSEADDR (a restart may rebind past TIME_WAIT) but not SO_REUSEPORT,
// so a second server cannot share the port.
absl::StatusOr<int> Listen(const std::string& listen, int backlog, int* bound_port) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen must be HOST:PORT (port 0 picks a free one), got \"", listen, "\""));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string host = listen.substr(0, colon);
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--http-listen: \"", host, "\" is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("--http-listen: socket: ", std::strerror(errno)));
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    std::string holder = err == EADDRINUSE ? ProcessListeningOn(port) : "";
    return absl::UnavailableError(absl::StrCat("--http-listen: cannot listen on ", listen, ": ", std::strerror(err),
                                               holder.empty() ? "" : absl::StrCat(" (held by ", holder, ")")));
  }
  if (::listen(fd, backlog) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("--http-listen: listen: ", std::strerror(err)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

void HttpServer::Impl::ReapLoop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stopping.load()) {
    reaper_cv.wait_for(lock, std::chrono::milliseconds(250));
    const Clock::time_point now = Clock::now();
    for (auto& [c, conn] : conns) {
      // A client that dribbles its headers or body past the timeout: shut the socket down, and
      // the event loop closes the connection (the descriptor stays MHD's until then).
      if (conn.reading && conn.fd >= 0 && now > conn.deadline) {
        shutdown(conn.fd, SHUT_RDWR);
        conn.fd = -1;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                            std::vector<HttpRoute> routes) {
  if (options.threads < 1) return absl::InvalidArgumentError("--http-threads must be >= 1");
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.routes = std::move(routes);
  ASSIGN_OR_RETURN(impl.listen_fd, Listen(options.listen, options.backlog, &server->port_));
  impl.daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, 0, nullptr, nullptr, OnRequest,
      &impl, MHD_OPTION_LISTEN_SOCKET, impl.listen_fd, MHD_OPTION_THREAD_POOL_SIZE,
      static_cast<unsigned int>(options.threads), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(options.max_connections), MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      static_cast<unsigned int>(options.max_connections_per_address), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(options.idle_timeout_seconds), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      options.max_header_bytes, MHD_OPTION_NOTIFY_COMPLETED, OnCompleted, &impl, MHD_OPTION_NOTIFY_CONNECTION,
      OnConnection, &impl, MHD_OPTION_END);
  if (impl.daemon == nullptr) {
    close(impl.listen_fd);
    return absl::UnavailableError(absl::StrCat("--http-listen: the HTTP server did not start on ", options.listen));
  }
  impl.reaper = std::thread([&impl] { impl.ReapLoop(); });
  return server;
}

HttpServer::~HttpServer() {
  if (impl_ == nullptr) return;
  impl_->stopping.store(true);
  impl_->reaper_cv.notify_all();
  if (impl_->reaper.joinable()) impl_->reaper.join();
  // MHD may not stop with a connection suspended: every pending answer is resumed first, and
  // finds the server stopping (a 503, or the end of its stream).
  std::vector<std::shared_ptr<ReplyState>> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& w : impl_->replies) {
      if (auto r = w.lock()) pending.push_back(std::move(r));
    }
  }
  for (const auto& r : pending) r->Abandon();
  for (int i = 0; i < 200; ++i) {  // the event loops pick the resumed connections up
    bool any = false;
    for (const auto& r : pending) any |= r->suspended();
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  MHD_stop_daemon(impl_->daemon);
  close(impl_->listen_fd);
}

}  // namespace moeserve::server
