// One self-owning reactor per Generate stream (gRPC callback API). It parses the raw request,
// submits it to the engine and never blocks a gRPC thread: the engine's callback only queues
// the request's events, the encoder thread (stream_encoder.h) turns them into responses
// through the request's stream (request_stream.h: text, stop strings, logprobs, usage, the
// final status), and the reactor writes those one at a time, coalescing
// tokens that arrive while a write is in flight. The last message goes out with the OK status
// in one operation (StartWriteAndFinish), so no server-side deadline or cancellation can land
// between them (a client's own deadline timer still can: docs/hardening.md).
#pragma once

#include <deque>
#include <mutex>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "text/model_tokenizer.h"
#include "server/drain_gate.h"
#include "server/request_stream.h"
#include "server/stream_encoder.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "server/validation.h"

namespace moeserve::server {

inline constexpr char kUnauthenticatedMessage[] = "missing or wrong \"authorization: Bearer <key>\"";

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Starts the call: on bad input or refusal it finishes at once with the matching status.
  // `tenant` is the caller's, the prefix cache's namespace, or why the call is not admitted.
  // `gate` (may be null) counts the stream while it runs and refuses it once draining.
  GenerateReactor(Engine* engine, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& request,
                  const RequestLimits& limits, std::shared_ptr<const ModelTokenizer> tokenizer,
                  const absl::StatusOr<std::string>& tenant, DrainGate* gate, StreamEncoder* encoder);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  // Waits for an engine callback still inside OnEvent before freeing the reactor.
  void OnDone() override {
    { std::lock_guard<std::mutex> lock(mu_); }
    DrainGate* gate = entered_gate_;
    delete this;
    if (gate != nullptr) gate->Leave();
  }

 private:
  void OnEvent(const RequestEvent& ev);  // on the engine thread
  void Encode();                         // on the encoder thread
  // Turns an event into queued responses (text, logprobs, usage, final status) and writes.
  void AppendLocked(const RequestEvent& ev);
  void WriteNextLocked();

  Engine* engine_;
  StreamEncoder* encoder_;             // null: encode on the engine thread
  DrainGate* entered_gate_ = nullptr;  // set when this stream counts in the gate
  std::mutex mu_;
  std::optional<uint64_t> id_;
  bool cancel_requested_ = false;
  std::deque<RequestEvent> raw_;  // events not encoded yet
  bool encode_posted_ = false;    // an Encode is queued on the encoder
  std::deque<v1::GenerateResponse> queue_;
  grpc::ByteBuffer in_flight_;
  bool writing_ = false;
  bool client_gone_ = false;
  std::optional<grpc::Status> final_status_;
  bool finished_ = false;
  std::shared_ptr<const ModelTokenizer> tokenizer_;
  std::optional<RequestStream> stream_;  // set once the request is parsed: text, stop strings, outcome
};

// Maps absl status codes onto gRPC's (they share numbering).
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace moeserve::server
