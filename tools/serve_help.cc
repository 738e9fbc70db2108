// serve's flag groups (see serve_help.h): one table, flag name -> group.
#include "tools/serve_help.h"

#include <string>
#include <utility>
#include <vector>

namespace moeserve::tools {
namespace {

using Group = std::pair<const char*, std::vector<const char*>>;

const std::vector<Group>& Groups() {
  static const std::vector<Group> groups = {
      {"Model", {"model", "--model", "--preset", "--model-seed", "--load-format", "--dtype", "--quantization",
                 "--max-model-len", "--served-model-name", "--chat-template", "--generation-config", "--seed",
                 "--skip-tokenizer-init"}},
      {"Cache (KV blocks and tiers)",
       {"--block-size", "--kv-blocks", "--kv-cache-mb", "--kv-dtype", "--kv-cache-dtype", "--gpu-memory-utilization", "--no-prefix-caching",
        "--enable-prefix-caching", "--no-enable-prefix-caching", "--host-kv-mb", "--flash-kv-dir",
        "--flash-kv-purge-foreign", "--flash-kv-mb", "--sync-flash", "--preemption", "--max-retain-seconds"}},
      {"Parallel", {"--ep", "--pp", "--tensor-parallel-size", "--pipeline-parallel-size", "--enable-expert-parallel",
                    "--domain-size", "--ep-balance", "--expert-placement", "--expert-load", "--expert-replicas",
                    "--eplb-interval", "--eplb-window", "--enable-eplb", "--eplb-config", "--num-redundant-experts",
                    "--expert-load-out", "--micro-batches", "--fp32-dispatch"}},
      {"Scheduler", {"--max-num-seqs", "--max-tokens-per-step", "--max-num-batched-tokens", "--no-chunked-prefill",
                     "--max-waiting", "--fast-lane-max-batch", "--max-tokens-limit", "--no-wait-for-shared-prefix"}},
      {"Device and kernels", {"--backend", "--device", "--device-mb", "--threads", "--reference",
                              "--no-batch-invariant", "--cpu-isa", "--cpu-kernel"}},
      {"Frontend (OpenAI HTTP API, gRPC)",
       {"--host", "--port", "--http-listen", "--http-port-file", "--http-threads", "--http-max-connections",
        "--http-max-connections-per-address", "--http-header-timeout", "--http-body-timeout", "--http-idle-timeout",
        "--http-backlog", "--listen", "--port-file", "--api-key", "--api-keys-file", "--tls-cert", "--tls-key",
        "--max-message-bytes", "--max-metadata-bytes", "--grace-seconds"}},
      {"Observability and cost", {"--hardware", "--calibration", "--price-per-hour", "--trace-jsonl", "--trace-chrome",
                                  "--metrics-listen", "--metrics-port-file"}},
  };
  return groups;
}

}  // namespace

void GroupServeFlags(CLI::App* cmd) {
  for (CLI::Option* opt : cmd->get_options()) {
    if (opt->get_name() == "--help") continue;
    opt->group("Other");
  }
  for (const auto& [group, names] : Groups()) {
    for (const char* name : names) {
      if (CLI::Option* opt = cmd->get_option_no_throw(name)) opt->group(group);
    }
  }
}

}  // namespace moeserve::tools
