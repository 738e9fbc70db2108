// The moeserve.v1.Moeserve service on the gRPC callback API.
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "models/generation_defaults.h"
#include "text/model_tokenizer.h"
#include "server/api_keys.h"
#include "server/drain_gate.h"
#include "server/stream_encoder.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "server/validation.h"

namespace moeserve::server {

struct ServiceOptions {
  ApiKeys api_keys;  // none: no authentication
  RequestLimits limits;  // the engine's (EngineConfig::limits)
  // Largest request metadata a call may carry (HPACK size: name + value + 32 per entry). The
  // transport's own limit is set far above it (ServerOptions), so an oversized call is refused
  // here, alone, and the connection's other streams live.
  size_t max_metadata_bytes = 16 << 10;
  v1::ModelInfo model_info;  // GetModelInfo's answer; its parallel_layout is the engine's at the call
  // The checkpoint's sampling defaults for OpenAI API requests (serve --generation-config).
  GenerationDefaults generation_defaults;
  // The served checkpoint's tokenizer, EOS ids and chat template.
  std::shared_ptr<const ModelTokenizer> tokenizer =
      std::make_shared<const ModelTokenizer>(ModelTokenizer::Bytes());
};

// Every method takes raw bytes and parses them itself (server/wire.h), so a request that does
// not parse gets INVALID_ARGUMENT with the reason.
using RawService = v1::Moeserve::WithRawCallbackMethod_Generate<
    v1::Moeserve::WithRawCallbackMethod_GetModelInfo<v1::Moeserve::WithRawCallbackMethod_GetStats<v1::Moeserve::Service>>>;

class MoeserveService final : public RawService {
 public:
  // `gate` (may be null) tracks Generate streams for graceful shutdown.
  // `encoder` (may be null: the engine thread encodes) builds the Generate streams' messages.
  MoeserveService(Engine* engine, ServiceOptions options, DrainGate* gate = nullptr, StreamEncoder* encoder = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

 private:
  // Admits a call: RESOURCE_EXHAUSTED when its metadata is over the limit, UNAUTHENTICATED
  // when a key is required and missing or wrong; else the caller's tenant ("": the default).
  absl::StatusOr<std::string> Admit(grpc::CallbackServerContext* ctx) const;
  // Authenticates and parses a unary call's (empty) request; finishes the reactor on failure.
  bool AcceptUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                   google::protobuf::Message* parsed, grpc::ServerUnaryReactor* reactor) const;

  Engine* engine_;
  ServiceOptions options_;
  DrainGate* gate_;
  StreamEncoder* encoder_;
};

// Fills the parts of GetStats that come from the engine.
void FillStats(const EngineStats& s, v1::Stats* out);

}  // namespace moeserve::server
