// vLLM's expert load balancer flags on `moeserve serve`: --enable-eplb, --eplb-config JSON and
// --num-redundant-experts, as moeserve's --eplb-interval, --eplb-window and --expert-replicas.
#pragma once

#include "absl/status/status.h"
#include "tools/vllm_flags.h"

namespace moeserve::tools {

// vLLM's defaults: re-place every 3000 steps from the last 1000 steps' routing.
inline constexpr int64_t kVllmEplbStepInterval = 3000, kVllmEplbWindowSize = 1000;

// Applies them to `engine` (whose --ep the -tp flags have set). --eplb-config's keys:
// window_size, step_interval and num_redundant_experts map; log_balancedness,
// log_balancedness_interval and use_async are accepted (they change no output: moeserve logs
// the balance at each re-placement and exports it in /metrics, and re-places between steps);
// policy other than "default", a communicator, or an unknown key is refused by name.
absl::Status ApplyVllmEplb(const VllmFlags& f, EngineFlags* engine);

}  // namespace moeserve::tools
