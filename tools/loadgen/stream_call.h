// One Generate stream driven by gRPC's callback client API, timing every streamed message.
// The call owns itself and never blocks a gRPC thread.
#pragma once

#include <functional>
#include <string>

#include "core/clock.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "tools/loadgen/metrics.h"

namespace moeserve::loadgen {

struct CallOptions {
  std::string api_key;            // sent as "authorization: Bearer KEY" when set
  double timeout_seconds = 0.0;   // client deadline; 0: none
};

// Sends `request` and calls `done` (on a gRPC thread) with the result once the stream ends.
// send_seconds is measured from `origin`.
void StartGenerate(moeserve::v1::Moeserve::Stub* stub, moeserve::v1::GenerateRequest request,
                   const CallOptions& options, Clock::time_point origin,
                   std::function<void(RequestResult)> done);

}  // namespace moeserve::loadgen
