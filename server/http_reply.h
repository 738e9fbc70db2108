// An answer in the making (http_server.h's HttpReply) and its side facing libmicrohttpd: the
// handler's thread fills it, the event loop queues it on the connection, suspending the
// connection while nothing is there to send and resuming it when something is.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/http_server.h"

namespace moeserve::server {

class ReplyState final : public HttpReply, public std::enable_shared_from_this<ReplyState> {
 public:
  void Send(int status, std::string content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override;
  void StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override;
  bool Write(std::string chunk) override;
  void End() override;
  void OnGone(std::function<void()> gone) override;
  bool CheckGone() override;

  // Event-loop side. Queues the answer on `c` if there is one (`closing`: the connection closes
  // after it, for refusals sent before the body is read); otherwise suspends `c` until there is.
  // True when queued.
  bool QueueOrSuspend(MHD_Connection* c, bool closing);
  // The request is over on its connection (aborted: the client left or the connection failed).
  void Closed(bool aborted);
  // The server stops: a waiting connection is resumed and finds nothing more will come.
  void Abandon();
  bool suspended() const;

 private:
  static ssize_t Read(void* cls, uint64_t pos, char* buf, size_t max);
  static void Free(void* cls);
  bool QueueLocked(MHD_Connection* c, bool closing);
  void ResumeLocked();

  enum class Kind { kNone, kWhole, kStream };
  mutable std::mutex mu_;
  Kind kind_ = Kind::kNone;
  int status_ = 200;
  std::string content_type_, body_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::deque<std::string> chunks_;
  size_t offset_ = 0;            // into chunks_.front()
  bool ended_ = false;           // End() called
  MHD_Connection* conn_ = nullptr;  // set while suspended (and for a queued stream)
  bool suspended_ = false, closed_ = false, gone_ = false, abandoned_ = false;
  std::function<void()> on_gone_;
};

}  // namespace moeserve::server
