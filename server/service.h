// The moeserve.v1.Moeserve service on the gRPC callback API.
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "server/drain_gate.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "server/validation.h"

namespace moeserve::server {

struct ServiceOptions {
  std::string api_key;  // empty: no authentication
  ValidationLimits limits;
  v1::ModelInfo model_info;  // static part of GetModelInfo
};

class MoeserveService final : public v1::Moeserve::CallbackService {
 public:
  // `gate` (may be null) tracks Generate streams for graceful shutdown.
  MoeserveService(Engine* engine, ServiceOptions options, DrainGate* gate = nullptr);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest* request,
                                     v1::Stats* response) override;

 private:
  bool Authorized(grpc::CallbackServerContext* ctx) const;

  Engine* engine_;
  ServiceOptions options_;
  DrainGate* gate_;
};

// Fills the parts of GetStats that come from the engine.
void FillStats(const EngineStats& s, v1::Stats* out);

}  // namespace moeserve::server
