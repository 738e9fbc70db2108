// vLLM's launch line for `moeserve serve`: `moeserve serve MODEL --host H --port P
// --max-model-len N --dtype bfloat16 -tp 1 --enable-expert-parallel ...`. Each flag maps onto
// moeserve's where it means the same thing and is refused by name where it does not
// (docs/vllm-flags.md has the table).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model_loader.h"
#include "tools/commands.h"

namespace moeserve::tools {

struct VllmFlags {
  std::string model;  // the positional MODEL
  std::string host;
  int port = -1;
  int64_t max_model_len = 0;
  int tensor_parallel = 1;
  int pipeline_parallel = 0;  // 0: not given
  bool enable_expert_parallel = false;
  int64_t max_num_batched_tokens = 0;
  bool enable_prefix_caching = false, no_enable_prefix_caching = false;
  double gpu_memory_utilization = -1;
  bool enable_eplb = false;
  int64_t num_redundant_experts = -1;  // -1: not given
  std::string eplb_config;             // --eplb-config's JSON; empty: not given
  bool skip_tokenizer_init = false;
  std::string kv_cache_dtype;  // empty: not given
};

void AddVllmFlags(CLI::App* cmd, VllmFlags* flags);

// Applies the parsed flags: the model directory, the HTTP address (`http_listen`, which must
// not also have been set by --http-listen: `http_listen_given`), the layout and scheduler
// settings of `engine`, and the request limit on the model length.
absl::Status ApplyVllmFlags(const VllmFlags& flags, bool http_listen_given, ModelSpec* model,
                            std::string* http_listen, EngineFlags* engine);

// vLLM's --kv-cache-dtype, once the model is known (`model` finished by FinishModelSpec): "auto"
// and "bfloat16" as ResolveKvDtype reads auto and bf16; fp8 caches are refused. It sets
// `engine`'s KV dtype, and refuses an explicit --kv-dtype (`kv_dtype_given`) that differs.
// Without it, `engine`'s own --kv-dtype is resolved.
absl::Status ApplyVllmKvCacheDtype(const VllmFlags& flags, bool kv_dtype_given, const ModelSpec& model,
                                   EngineFlags* engine);

// argv with vLLM's two-letter flags (-tp, -pp), which CLI11 cannot name, spelled long (for
// `moeserve serve` only; other commands' arguments are left as they are).
std::vector<std::string> ExpandVllmShortFlags(int argc, char** argv);

// vLLM's --dtype spellings (auto, bfloat16, float16, half, float32, float) as moeserve's (empty
// for auto: the checkpoint's); moeserve's own (bf16, f16, f32) pass through.
absl::StatusOr<std::string> DTypeFlag(const std::string& spelling);

}  // namespace moeserve::tools
