// The thread that turns engine events into wire messages for the Generate streams: the
// engine's callback only queues a request's raw events and posts its stream here once, and this
// thread detokenizes, builds and serialises the responses and starts their writes. So the
// engine thread never spends a step's time on protobufs or text.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace moeserve::server {

class StreamEncoder {
 public:
  StreamEncoder();
  // Runs what is still queued, then joins.
  ~StreamEncoder();
  StreamEncoder(const StreamEncoder&) = delete;
  StreamEncoder& operator=(const StreamEncoder&) = delete;

  void Post(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::server
