// The HTTP/1.1 server under the OpenAI API, on GNU libmicrohttpd (Debian's libmicrohttpd-dev):
// a few event loops serve every connection, so a slow or idle client costs a socket, not a
// thread (docs/hardening.md says why it replaced cpp-httplib). What it guarantees:
//   - a route's header check (the API key) runs once the headers are in, before any body byte
//     is read; a body over the limit (Content-Length or chunked) is refused with 413 as soon as
//     it crosses it;
//   - connections are bounded in all and per client address; a connection that has not sent
//     its headers, or its body, within the read timeouts is closed; idle keep-alive ones too;
//   - the listening socket is ours: no SO_REUSEPORT (a second server on a taken port fails at
//     start, naming the process holding it where /proc tells), a backlog sized for bursts;
//   - answers come from any thread, whole or as a stream of chunks (chunked on HTTP/1.1,
//     close-delimited on HTTP/1.0); pipelined requests are answered in order;
//   - a client that leaves is reported to the request's owner (OnGone).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace moeserve::server {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:8000";  // HOST:PORT (IPv4); port 0 picks a free one
  int threads = 4;                        // event loops
  int max_connections = 1024;             // in all
  int max_connections_per_address = 256;  // from one client address
  int backlog = 1024;                     // accept queue: a burst of clients is queued, not reset
  int header_timeout_seconds = 10;        // from connect to the end of the request headers
  int body_timeout_seconds = 30;          // from the headers to the end of the body
  int idle_timeout_seconds = 60;          // a connection silent this long is closed
  size_t max_body_bytes = 4 << 20;
  size_t max_header_bytes = 32 << 10;
  // The body of the server's own refusals (404, 405, 413, 503): the API's error object.
  std::function<std::string(int status, const std::string& message)> error_body;
};

struct HttpRequest {
  std::string method, path, version;      // version: "HTTP/1.0" or "HTTP/1.1"
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string client;                     // the peer's address
  // The header's value, or "" when absent.
  std::string Header(const std::string& lower_name) const;
};

// How a handler answers, once, from any thread: a whole response, or a stream of chunks.
class HttpReply {
 public:
  virtual ~HttpReply() = default;
  virtual void Send(int status, std::string content_type, std::string body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // Starts a stream (the status line and headers go out with the first chunk).
  virtual void StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // False once the client is gone (the chunk is dropped).
  virtual bool Write(std::string chunk) = 0;
  virtual void End() = 0;
  // `gone` runs once if the client leaves before the answer is complete (on an event-loop
  // thread; it may call Write/End, which then do nothing). Set it before answering.
  virtual void OnGone(std::function<void()> gone) = 0;
  // True once the client has left. While a whole answer is still awaited (the connection waits,
  // unwatched by the event loop), it looks at the socket itself: a peer that closed or reset it
  // is gone, and the OnGone callback runs here, on the caller's thread.
  virtual bool CheckGone() = 0;
};

// A route: `check` sees the headers before the body is read and may answer instead (return
// false after answering); `handle` gets the whole request.
struct HttpRoute {
  std::string method, path;
  std::function<bool(const HttpRequest&, HttpReply&)> check;  // may be empty
  std::function<void(const HttpRequest&, std::shared_ptr<HttpReply>)> handle;
};

class HttpServer {
 public:
  // Binds (refusing a port another process holds) and starts the event loops.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           std::vector<HttpRoute> routes);
  ~HttpServer();  // answers nothing more, resumes what waits, stops
  int port() const { return port_; }

  struct Exchange;  // one request on a connection (http_server.cc)
  struct Impl;

 private:
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// "pid 1234 (moeserve)" for the process listening on TCP `port`, or "" when /proc does not say.
std::string ProcessListeningOn(int port);

}  // namespace moeserve::server
