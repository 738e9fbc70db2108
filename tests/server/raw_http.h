// A bounded raw HTTP client for the hardening tests (http_hardening_test.cc): a TCP connection
// whose connect, send and read all time out, responses parsed from raw bytes, and JSON POSTs
// through httplib.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::testing::raw_http {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A raw TCP connection to the server; connect, send and read are all bounded.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const timeval send_timeout{5, 0}, poll{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));  // bounds connect too
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &poll, sizeof(poll));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool Send(std::string_view s) {
    while (fd_ >= 0 && !s.empty()) {
      const ssize_t n = send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<size_t>(n));
    }
    return fd_ >= 0;
  }
  // Reads until `done(bytes so far)`, the peer closes (eof()) or `seconds` pass.
  const std::string& Read(double seconds, const std::function<bool(const std::string&)>& done = nullptr) {
    const auto t0 = Clock::now();
    char buf[16384];
    while (fd_ >= 0 && !eof_ && !(done && done(in_)) && SecondsSince(t0) < seconds) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        in_.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        eof_ = true;  // closed (or reset)
      }
    }
    return in_;
  }
  bool eof() const { return eof_; }
  // Not closed by the peer (checked without waiting).
  bool StillOpen() {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return fd_ >= 0 && (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)));
  }

 private:
  int fd_ = -1;
  bool eof_ = false;
  std::string in_;
};

// One response from raw bytes: the status, the header block (lower-cased), the body, and the
// declared Content-Length (npos when none).
struct RawResponse {
  int status = -1;
  std::string headers, body;
  size_t length = std::string::npos;
};
inline RawResponse ParseResponse(const std::string& raw) {
  RawResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || raw.compare(0, 7, "HTTP/1.") != 0 || end == std::string::npos) return r;
  r.status = std::atoi(raw.substr(9, 3).c_str());
  r.headers = raw.substr(0, end);
  for (char& c : r.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = raw.substr(end + 4);
  if (const size_t at = r.headers.find("content-length:"); at != std::string::npos) {
    r.length = std::stoul(r.headers.substr(at + 15));
  }
  return r;
}
// True once `raw` holds a whole response with a Content-Length body.
inline bool WholeResponse(const std::string& raw) {
  const RawResponse r = ParseResponse(raw);
  return r.length != std::string::npos && r.body.size() >= r.length;
}
// The responses in `raw`, one after another (each with a Content-Length body).
inline std::vector<RawResponse> SplitResponses(std::string raw) {
  std::vector<RawResponse> out;
  while (!raw.empty()) {
    out.push_back(ParseResponse(raw));
    RawResponse& r = out.back();
    if (r.status < 0 || r.length == std::string::npos) break;
    r.body.resize(std::min(r.length, r.body.size()));
    raw.erase(0, std::min(raw.find("\r\n\r\n") + 4 + r.length, raw.size()));
  }
  return out;
}
inline std::string PostBytes(const std::string& version, const std::string& body) {
  return "POST /v1/completions " + version + "\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline httplib::Client Client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(60, 0);
  c.set_write_timeout(30, 0);
  return c;
}
// POSTs `body` (JSON text); returns (status, parsed body), status -1 when there was no answer.
inline std::pair<int, Json> Post(int port, const std::string& path, const std::string& body) {
  auto r = Client(port).Post(path.c_str(), body, "application/json");
  if (!r) return {-1, Json(httplib::to_string(r.error()))};
  return {r->status, Json::parse(r->body, nullptr, false)};
}
inline std::string Message(const Json& j) {
  return j.is_object() && j.contains("error") ? j["error"].value("message", "") : j.dump();
}
inline int Code(const std::string& body) {
  const Json j = Json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"].value("code", 0) : 0;
}

inline constexpr const char* kSmall = R"({"prompt": "hi", "max_tokens": 4})";

}  // namespace moeserve::testing::raw_http
