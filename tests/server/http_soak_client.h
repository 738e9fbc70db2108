// The OpenAI HTTP soak's client side (http_soak_test.cc): its tenants' keys, what one client
// saw of one request (each answer's shape checked, whole or streamed), how a client leaves,
// raw requests httplib cannot send, /metrics outcomes, and random prompts.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/server/raw_http.h"

namespace moeserve::testing::http_soak {

using raw_http::Clock;
using raw_http::EndsWith;
using raw_http::Json;
using raw_http::SecondsSince;

inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

const char* const kKeys[2][2] = {{"key-alice-1", "key-alice-2"}, {"key-bob-1", "key-bob-1"}};
const char* const kKeysFile = "# tenant key\nalice key-alice-1\nbob key-bob-1\nalice key-alice-2\n";

// `moeserve_request_success_total{reason="R"} N` from GET /metrics, by R.
inline std::map<std::string, int64_t> MetricsOutcomes(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(10, 0);
  std::map<std::string, int64_t> out;
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return out;
  const std::string prefix = "moeserve_request_success_total{reason=\"";
  std::istringstream lines(r->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t quote = line.find('"', prefix.size());
    const size_t space = line.rfind(' ');
    if (quote == std::string::npos || space == std::string::npos) continue;
    out[line.substr(prefix.size(), quote - prefix.size())] = std::atoll(line.c_str() + space + 1);
  }
  return out;
}

// Raw bytes to the server and its answer's status (-1 for none within `seconds`), for what
// httplib cannot send (a declared length with no body; a chunked body over the limit).
inline int RawStatus(int port, const std::string& head, const std::string& chunk, int chunks, double seconds) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval send_timeout{5, 0}, poll{0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &poll, sizeof(poll));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto send_all = [fd](std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = send(fd, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  };
  std::string in;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && send_all(head)) {
    for (int i = 0; i < chunks && send_all(chunk); ++i) {
    }
    if (chunks > 0) send_all("0\r\n\r\n");
    const auto t0 = Clock::now();
    char buf[4096];
    while (SecondsSince(t0) < seconds && in.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;
      }
    }
  }
  close(fd);
  return in.size() >= 12 && in.compare(0, 7, "HTTP/1.") == 0 ? std::atoi(in.substr(9, 3).c_str()) : -1;
}

// What one client saw of one request.
struct Seen {
  int status = -1;       // -1: no response
  bool complete = false;  // a whole answer: a JSON object with a finish reason, or a stream to [DONE]
  bool left = false;      // the client left before the answer was complete
  std::string text, finish_reason, problem;  // problem: why the answer is malformed
  std::string raw;
};

// How a client may leave: after `events` stream events, or `seconds` after sending.
struct Leave {
  int events = 0;
  double seconds = 0;
};

// The text of a completions or chat answer (whole or streamed), checking its shape: a stream
// is "data: {...}\n\n" events, exactly one with a finish reason (only a usage chunk after it),
// no error event, then "data: [DONE]\n\n" and nothing more.
inline void ReadAnswer(bool chat, bool stream, Seen* s) {
  if (!stream) {
    const Json j = Json::parse(s->raw, nullptr, false);
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].size() != 1) {
      s->problem = "not a completion object: " + s->raw.substr(0, 300);
      return;
    }
    const Json& c = j["choices"][0];
    if (!c.contains("finish_reason") || !c["finish_reason"].is_string()) {
      s->problem = "no finish_reason: " + s->raw.substr(0, 300);
      return;
    }
    s->finish_reason = c["finish_reason"];
    const Json& t = chat ? c["message"]["content"] : c["text"];
    if (!t.is_string()) {
      s->problem = "no text: " + s->raw.substr(0, 300);
      return;
    }
    s->text = t.get<std::string>();
    s->complete = true;
    return;
  }
  if (!EndsWith(s->raw, "\n\ndata: [DONE]\n\n")) {
    s->problem = "the stream does not end with [DONE]: ..." + s->raw.substr(s->raw.size() - std::min<size_t>(s->raw.size(), 200));
    return;
  }
  size_t at = 0;
  int finishes = 0;
  while (at < s->raw.size()) {
    const size_t end = s->raw.find("\n\n", at);
    if (end == std::string::npos || s->raw.compare(at, 6, "data: ") != 0) {
      s->problem = "not an event at byte " + std::to_string(at);
      return;
    }
    const std::string data = s->raw.substr(at + 6, end - at - 6);
    at = end + 2;
    if (data == "[DONE]") {
      if (at != s->raw.size()) s->problem = "bytes after [DONE]";
      break;
    }
    const Json j = Json::parse(data, nullptr, false);
    if (!j.is_object() || j.contains("error") || !j.contains("choices") || !j["choices"].is_array()) {
      s->problem = "unexpected event: " + data.substr(0, 300);
      return;
    }
    if (j["choices"].empty()) {  // the usage chunk
      if (finishes != 1) s->problem = "a usage chunk before the finish reason";
      continue;
    }
    if (finishes > 0) {
      s->problem = "an event after the finish reason: " + data.substr(0, 300);
      return;
    }
    const Json& c = j["choices"][0];
    const Json& t = chat ? c["delta"].value("content", Json("")) : c["text"];
    if (!t.is_string()) {
      s->problem = "no text in: " + data.substr(0, 300);
      return;
    }
    s->text += t.get<std::string>();
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
      ++finishes;
      s->finish_reason = c["finish_reason"];
    }
  }
  if (s->problem.empty() && finishes != 1) s->problem = std::to_string(finishes) + " finish reasons";
  if (s->problem.empty()) s->complete = true;
}

// POSTs `body` as `key` ("" for none) on the thread's keep-alive client and reads the answer,
// leaving as `leave` says.
inline Seen Post(httplib::Client& client, const std::string& path, const std::string& body, const std::string& key,
          bool chat, bool stream, Leave leave = {}) {
  Seen s;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (!key.empty()) req.set_header("Authorization", "Bearer " + key);
  const auto t0 = Clock::now();
  bool cancelled = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    s.raw.append(data, n);
    if (EndsWith(s.raw, "data: [DONE]\n\n")) return true;
    bool go = false;
    if (leave.events > 0) {
      int events = 0;
      for (size_t at = s.raw.find("\n\n"); at != std::string::npos; at = s.raw.find("\n\n", at + 2)) ++events;
      go = events >= leave.events;
    }
    if (leave.seconds > 0 && SecondsSince(t0) >= leave.seconds) go = true;
    cancelled = go;
    return !go;
  };
  if (leave.seconds > 0) {
    client.set_read_timeout(std::chrono::microseconds(static_cast<int64_t>(leave.seconds * 1e6)));
  } else {
    client.set_read_timeout(60, 0);
  }
  auto r = client.send(req);
  if (!r) {
    // Left on purpose: by the receiver, or by the read timeout it asked for.
    if (cancelled || (leave.seconds > 0 && r.error() == httplib::Error::Read &&
                      SecondsSince(t0) >= 0.9 * leave.seconds)) {
      s.left = true;
    } else {
      s.problem = "no response: " + httplib::to_string(r.error()) + " after " + std::to_string(SecondsSince(t0)) + " s";
    }
    return s;
  }
  s.status = r->status;
  if (s.status == 200) {
    ReadAnswer(chat, stream, &s);
  } else {
    // A refusal: the API's error object, its code the status.
    const Json j = Json::parse(s.raw, nullptr, false);
    if (!j.is_object() || !j.contains("error") || j["error"].value("code", 0) != s.status) {
      s.problem = "not an error object with code " + std::to_string(s.status) + ": " + s.raw.substr(0, 300);
    }
  }
  return s;
}

// A few fixed prompts answered greedily (ignore_eos, 12 tokens): their solo text, and a stop
// string taken from it with the text it must cut to.
struct Greedy {
  bool chat = false;
  Json body;  // without "stream" and "stop"
  std::string solo, stop, cut;
};

inline std::string Path(bool chat) { return chat ? "/v1/chat/completions" : "/v1/completions"; }

inline std::string RandomText(std::mt19937& g, int min_len, int max_len) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;!?-";
  const int n = std::uniform_int_distribution<int>(min_len, max_len)(g);
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(kChars[g() % (sizeof(kChars) - 1)]);
  return s;
}

// A prompt of `min_len`-`max_len` bytes: text for the completions endpoint (sometimes token
// ids), messages for chat.
inline void SetPrompt(std::mt19937& g, bool chat, int min_len, int max_len, Json* body) {
  if (chat) {
    Json messages = Json::array();
    if (g() % 3 == 0) messages.push_back({{"role", "system"}, {"content", RandomText(g, 1, 20)}});
    messages.push_back({{"role", "user"}, {"content", RandomText(g, min_len, max_len)}});
    (*body)["messages"] = messages;
  } else if (g() % 4 == 0) {
    Json ids = Json::array({256});
    const int n = std::uniform_int_distribution<int>(min_len, max_len)(g);
    for (int i = 0; i < n; ++i) ids.push_back(static_cast<int>(g() % 256));
    (*body)["prompt"] = ids;
  } else {
    (*body)["prompt"] = RandomText(g, min_len, max_len);
  }
}

}  // namespace moeserve::testing::http_soak
