// One self-owning reactor per Generate stream (gRPC callback API). It submits the request to
// the engine and never blocks a gRPC thread: the engine's callback queues responses and the
// reactor writes them one at a time, coalescing tokens that arrive while a write is in flight.
#pragma once

#include <deque>
#include <mutex>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "models/tokenizer.h"
#include "server/drain_gate.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "server/validation.h"

namespace moeserve::server {

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // Starts the call: on bad input or refusal it finishes at once with the matching status.
  // `gate` (may be null) counts the stream while it runs and refuses it once draining.
  GenerateReactor(Engine* engine, grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request,
                  const ValidationLimits& limits, bool authorized, DrainGate* gate);

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
  void WriteNextLocked();

  Engine* engine_;
  DrainGate* entered_gate_ = nullptr;  // set when this stream counts in the gate
  std::mutex mu_;
  std::optional<uint64_t> id_;
  bool cancel_requested_ = false;
  std::deque<v1::GenerateResponse> queue_;
  v1::GenerateResponse in_flight_;
  bool writing_ = false;
  bool client_gone_ = false;
  std::optional<grpc::Status> final_status_;
  bool finished_ = false;
  IncrementalDecoder decoder_;
};

// Maps absl status codes onto gRPC's (they share numbering).
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace moeserve::server
