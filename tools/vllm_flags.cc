// vLLM's launch flags on `moeserve serve`.
#include "tools/vllm_flags.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "models/model_config.h"
#include "tools/commands.h"
#include "tools/vllm_eplb.h"

namespace moeserve::tools {

void AddVllmFlags(CLI::App* cmd, VllmFlags* f) {
  cmd->add_option("model", f->model,
                  "The checkpoint directory, as vLLM's positional MODEL (the same as --model; a Hugging Face id is "
                  "refused: moeserve reads local checkpoints)");
  cmd->add_option("--host", f->host, "HTTP API host, as vLLM's (with --port; default 127.0.0.1)");
  cmd->add_option("--port", f->port, "HTTP API port, as vLLM's (default 8000; gRPC keeps --listen)");
  cmd->add_option("--max-model-len", f->max_model_len,
                  "Tokens a sequence may reach, prompt and output; a request asking past it gets 400 (default: the "
                  "model's context)");
  cmd->add_option("--tensor-parallel-size", f->tensor_parallel,
                  "-tp: only 1, or N with --enable-expert-parallel (experts over N ranks, attention replicated "
                  "and data-parallel); moeserve has no tensor parallelism");
  cmd->add_option("--pipeline-parallel-size", f->pipeline_parallel, "-pp: pipeline stages (the same as --pp)");
  cmd->add_flag("--enable-expert-parallel", f->enable_expert_parallel,
                "With -tp N: spread the experts over N ranks (the same as --ep N)");
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                  "Token budget of one step (the same as --max-tokens-per-step)");
  cmd->add_flag("--enable-prefix-caching", f->enable_prefix_caching, "Share KV blocks between equal prefixes (the default)");
  cmd->add_flag("--no-enable-prefix-caching", f->no_enable_prefix_caching, "The same as --no-prefix-caching");
  cmd->add_flag("--skip-tokenizer-init", f->skip_tokenizer_init,
                "As vLLM's: read no tokenizer files; requests send token ids (text prompts, chat, stop strings and "
                "/tokenize are refused), answers carry token ids (return_token_ids) and empty text; EOS from "
                "generation_config.json or config.json");
  cmd->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                  "auto: the KV cache in the weights' dtype (bf16 for bf16 and FP8 weights, f32 for f32 and f16), as "
                  "vLLM's default; bfloat16: bf16 (the same as --kv-dtype bf16); vLLM's fp8 caches are refused "
                  "(moeserve's holds f32 or bf16). Without it moeserve's --kv-dtype applies (default auto, the same)");
  cmd->add_option("--gpu-memory-utilization", f->gpu_memory_utilization,
                  "Refused: moeserve sizes the KV cache in bytes (--kv-cache-mb, and --device-mb on a GPU)");
  cmd->add_flag("--enable-eplb", f->enable_eplb,
                "With -tp N --enable-expert-parallel: re-place the experts while serving, every 3000 steps from the "
                "last 1000 steps' routing (vLLM's defaults; the same as --eplb-interval 3000 --eplb-window 1000)");
  cmd->add_option("--eplb-config", f->eplb_config,
                  "With --enable-eplb, a JSON object: window_size (--eplb-window), step_interval (--eplb-interval), "
                  "num_redundant_experts (--expert-replicas); log_balancedness, log_balancedness_interval and "
                  "use_async are accepted (moeserve logs the balance at each re-placement and in /metrics, and "
                  "re-places between steps); a policy other than \"default\" or a communicator is refused");
  cmd->add_option("--num-redundant-experts", f->num_redundant_experts,
                  "With --enable-eplb: this many extra copies of the hottest experts per MoE layer (the same as "
                  "--expert-replicas R)");
}

std::vector<std::string> ExpandVllmShortFlags(int argc, char** argv) {
  std::vector<std::string> args;
  // Only `serve` has them: elsewhere "-pp" might be a prompt's text.
  const bool serve = argc > 1 && std::string(argv[1]) == "serve";
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!serve) {
      args.push_back(a);
      continue;
    }
    for (auto [from, to] : {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"},
                            {"-pp", "--pipeline-parallel-size"}}) {
      if (a == from || a.rfind(from + "=", 0) == 0) a = to + a.substr(from.size());
    }
    args.push_back(a);
  }
  return args;
}

absl::StatusOr<std::string> DTypeFlag(const std::string& s) {
  if (s.empty() || s == "auto") return std::string();
  if (s == "bfloat16" || s == "bf16") return std::string("bf16");
  if (s == "float16" || s == "half" || s == "f16") return std::string("f16");
  if (s == "float32" || s == "float" || s == "f32") return std::string("f32");
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype: '", s, "' is not one of auto, bfloat16, float16, half, float32, float, bf16, f16, f32"));
}

absl::Status ApplyVllmFlags(const VllmFlags& f, bool http_listen_given, ModelSpec* model, std::string* http_listen,
                            EngineFlags* engine) {
  if (!f.model.empty()) {
    if (!model->model_dir.empty() && model->model_dir != f.model) {
      return absl::InvalidArgumentError(absl::StrCat("MODEL '", f.model, "' and --model '", model->model_dir,
                                                     "' name different checkpoints"));
    }
    if (!std::filesystem::exists(f.model)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MODEL: '", f.model, "' is not a directory here; moeserve reads local checkpoints (fetch one with "
          "`huggingface-cli download ", f.model, " --local-dir DIR` and pass DIR)"));
    }
    model->model_dir = f.model;
  }
  model->skip_tokenizer_init = f.skip_tokenizer_init;
  if (!f.host.empty() || f.port >= 0) {
    if (http_listen_given) return absl::InvalidArgumentError("give --host/--port or --http-listen, not both");
    if (f.port > 65535) return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", f.port));
    *http_listen = absl::StrCat(f.host.empty() ? "127.0.0.1" : f.host, ":", f.port >= 0 ? f.port : 8000);
  }
  if (f.max_model_len != 0) engine->config.limits.max_model_len = f.max_model_len;
  if (f.tensor_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("-tp/--tensor-parallel-size must be >= 1, got ", f.tensor_parallel));
  }
  if (f.tensor_parallel > 1) {
    if (!f.enable_expert_parallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "-tp/--tensor-parallel-size ", f.tensor_parallel,
          ": moeserve has no tensor parallelism; add --enable-expert-parallel to spread the experts over ",
          f.tensor_parallel, " ranks (attention replicated, data-parallel), or use --ep / --pp"));
    }
    if (engine->config.parallel.ep > 1 && engine->config.parallel.ep != f.tensor_parallel) {
      return absl::InvalidArgumentError(absl::StrCat("-tp ", f.tensor_parallel, " --enable-expert-parallel and --ep ",
                                                     engine->config.parallel.ep, " disagree"));
    }
    engine->config.parallel.ep = f.tensor_parallel;
  }
  if (f.pipeline_parallel != 0) {
    if (f.pipeline_parallel < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("-pp/--pipeline-parallel-size must be >= 1, got ", f.pipeline_parallel));
    }
    if (engine->config.parallel.pp > 1 && engine->config.parallel.pp != f.pipeline_parallel) {
      return absl::InvalidArgumentError(
          absl::StrCat("-pp ", f.pipeline_parallel, " and --pp ", engine->config.parallel.pp, " disagree"));
    }
    engine->config.parallel.pp = f.pipeline_parallel;
  }
  if (f.max_num_batched_tokens != 0) engine->config.scheduler.max_tokens_per_step = f.max_num_batched_tokens;
  if (f.enable_prefix_caching && f.no_enable_prefix_caching) {
    return absl::InvalidArgumentError("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  }
  if (f.no_enable_prefix_caching) engine->no_prefix_caching = true;
  RETURN_IF_ERROR(ApplyVllmEplb(f, engine));
  if (f.gpu_memory_utilization >= 0) {
    return absl::InvalidArgumentError(
        "--gpu-memory-utilization: moeserve sizes the KV cache in bytes, not as a fraction of the device: use "
        "--kv-cache-mb (and --device-mb on a GPU)");
  }
  return absl::OkStatus();
}

absl::Status ApplyVllmKvCacheDtype(const VllmFlags& f, bool kv_dtype_given, const ModelSpec& model,
                                   EngineFlags* engine) {
  if (f.kv_cache_dtype.empty()) return ResolveKvDtype(model, &engine->kv_dtype);
  std::string want = f.kv_cache_dtype == "bfloat16" || f.kv_cache_dtype == "bf16" ? "bf16" : f.kv_cache_dtype;
  if (want != "auto" && want != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: '", f.kv_cache_dtype,
                                                   "' is not one of auto, bfloat16 (moeserve's KV cache holds f32 "
                                                   "or bf16; vLLM's fp8 caches are not implemented)"));
  }
  RETURN_IF_ERROR(ResolveKvDtype(model, &want));
  RETURN_IF_ERROR(ResolveKvDtype(model, &engine->kv_dtype));
  if (kv_dtype_given && engine->kv_dtype != want) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype ", f.kv_cache_dtype, " (", want,
                                                   " here) and --kv-dtype ", engine->kv_dtype, " disagree"));
  }
  engine->kv_dtype = want;
  return absl::OkStatus();
}

}  // namespace moeserve::tools
