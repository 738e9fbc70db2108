// Answers handed from handler threads to libmicrohttpd's event loops.
#include "server/http_reply.h"

#include <microhttpd.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace moeserve::server {
namespace {

constexpr size_t kStreamBlock = 16 << 10;  // bytes MHD asks the stream for at a time

void AddHeaders(MHD_Response* r, const std::string& content_type,
                const std::vector<std::pair<std::string, std::string>>& headers, bool closing) {
  MHD_add_response_header(r, "Content-Type", content_type.c_str());
  for (const auto& [k, v] : headers) MHD_add_response_header(r, k.c_str(), v.c_str());
  if (closing) MHD_add_response_header(r, "Connection", "close");
}

}  // namespace

void ReplyState::Send(int status, std::string content_type, std::string body,
                      std::vector<std::pair<std::string, std::string>> headers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind_ != Kind::kNone) return;  // answered once
  kind_ = Kind::kWhole;
  status_ = status;
  content_type_ = std::move(content_type);
  body_ = std::move(body);
  headers_ = std::move(headers);
  ResumeLocked();
}

void ReplyState::StartStream(int status, std::string content_type,
                             std::vector<std::pair<std::string, std::string>> headers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind_ != Kind::kNone) return;
  kind_ = Kind::kStream;
  status_ = status;
  content_type_ = std::move(content_type);
  headers_ = std::move(headers);
  ResumeLocked();
}

bool ReplyState::Write(std::string chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind_ != Kind::kStream || ended_ || closed_ || gone_ || abandoned_) return false;
  if (!chunk.empty()) chunks_.push_back(std::move(chunk));
  ResumeLocked();
  return true;
}

void ReplyState::End() {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  ResumeLocked();
}

void ReplyState::OnGone(std::function<void()> gone) {
  std::lock_guard<std::mutex> lock(mu_);
  on_gone_ = std::move(gone);
}

bool ReplyState::CheckGone() {
  std::function<void()> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_ || closed_) return true;
    if (!suspended_ || kind_ != Kind::kNone || conn_ == nullptr) return false;
    // Suspended, MHD neither reads nor closes the socket, so a peek here races with nothing.
    const MHD_ConnectionInfo* info = MHD_get_connection_info(conn_, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == nullptr) return false;
    char byte;
    const ssize_t n = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    const bool left = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (!left) return false;
    gone_ = true;
    gone = std::move(on_gone_);
  }
  if (gone) gone();
  return true;
}

bool ReplyState::suspended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return suspended_;
}

void ReplyState::ResumeLocked() {
  if (!suspended_) return;
  suspended_ = false;
  MHD_resume_connection(conn_);  // a suspended connection is never closed under us
}

bool ReplyState::QueueOrSuspend(MHD_Connection* c, bool closing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (QueueLocked(c, closing)) return true;
  if (abandoned_) {
    kind_ = Kind::kWhole;
    status_ = 503;
    content_type_ = "application/json";
    body_ = R"({"error":{"message":"the server is shutting down","type":"server_error","code":503}})";
    return QueueLocked(c, true);
  }
  conn_ = c;
  suspended_ = true;
  MHD_suspend_connection(c);
  return false;
}

bool ReplyState::QueueLocked(MHD_Connection* c, bool closing) {
  MHD_Response* r = nullptr;
  if (kind_ == Kind::kWhole) {
    r = MHD_create_response_from_buffer(body_.size(), body_.data(), MHD_RESPMEM_MUST_COPY);
  } else if (kind_ == Kind::kStream) {
    // Chunked on HTTP/1.1, close-delimited on HTTP/1.0 (MHD's choice for an unknown size).
    conn_ = c;
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, kStreamBlock, Read,
                                          new std::shared_ptr<ReplyState>(shared_from_this()), Free);
  }
  if (r == nullptr) return false;
  AddHeaders(r, content_type_, headers_, closing);
  MHD_queue_response(c, static_cast<unsigned int>(status_), r);
  MHD_destroy_response(r);
  return true;
}

ssize_t ReplyState::Read(void* cls, uint64_t, char* buf, size_t max) {
  ReplyState& s = **static_cast<std::shared_ptr<ReplyState>*>(cls);
  std::lock_guard<std::mutex> lock(s.mu_);
  size_t n = 0;
  while (n < max && !s.chunks_.empty()) {
    const std::string& front = s.chunks_.front();
    const size_t take = std::min(max - n, front.size() - s.offset_);
    std::memcpy(buf + n, front.data() + s.offset_, take);
    n += take;
    s.offset_ += take;
    if (s.offset_ == front.size()) {
      s.chunks_.pop_front();
      s.offset_ = 0;
    }
  }
  if (n > 0) return static_cast<ssize_t>(n);
  if (s.ended_) return MHD_CONTENT_READER_END_OF_STREAM;
  if (s.abandoned_ || s.closed_) return MHD_CONTENT_READER_END_WITH_ERROR;
  s.suspended_ = true;  // nothing yet: wait for Write or End
  MHD_suspend_connection(s.conn_);
  return 0;
}

void ReplyState::Free(void* cls) { delete static_cast<std::shared_ptr<ReplyState>*>(cls); }

void ReplyState::Closed(bool aborted) {
  std::function<void()> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    conn_ = nullptr;
    if (aborted && !gone_) {
      gone_ = true;
      gone = std::move(on_gone_);
    }
  }
  if (gone) gone();
}

void ReplyState::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_ = true;
  ResumeLocked();
}

}  // namespace moeserve::server
