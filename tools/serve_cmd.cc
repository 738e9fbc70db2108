// `moeserve serve`: the gRPC server over the continuous-batching engine.
#include <csignal>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/status.h"
#include "server/metrics_exporter.h"
#include "server/server_main.h"
#include "models/generation_defaults.h"
#include "tools/commands.h"
#include "tools/launch.h"
#include "tools/mpi_job.h"
#include "tools/serve_help.h"
#include "tools/vllm_flags.h"

namespace moeserve::tools {
namespace {

// A sequence must fit in its pool segment's KV blocks. Without --max-model-len, a model whose
// context is longer serves that many tokens (said at start; vLLM refuses to start instead);
// a --max-model-len past it is refused.
absl::Status FitModelLenToKvCache(const ModelConfig& c, EngineConfig* e) {
  ASSIGN_OR_RETURN(const KvLayout layout, Engine::CacheLayout(*e, c));
  const int64_t segments = e->parallel.enabled() ? e->parallel.ep : 1;
  const int64_t capacity = layout.num_blocks / segments * e->block_size;
  if (e->limits.max_model_len > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("--max-model-len ", e->limits.max_model_len, ": the KV cache holds ",
                                                   capacity, " tokens per sequence at most (raise --kv-cache-mb)"));
  }
  if (e->limits.max_model_len == 0 && c.max_position_embeddings > capacity) {
    e->limits.max_model_len = capacity;
    std::fprintf(stderr,
                 "moeserve: the KV cache holds %lld tokens per sequence, less than the model's context of %lld: "
                 "--max-model-len is %lld (raise --kv-cache-mb to serve longer sequences)\n",
                 static_cast<long long>(capacity), static_cast<long long>(c.max_position_embeddings),
                 static_cast<long long>(capacity));
  }
  return absl::OkStatus();
}

struct ServeOptions {
  ModelSpec model = DefaultModelSpec();
  std::string dtype;
  std::string load_format = "auto";
  EngineFlags engine;
  server::ServerOptions server;
  std::string api_key;
  std::string api_keys_file;
  size_t max_metadata_bytes = 16 << 10;
  int64_t max_tokens_limit = 0;  // 0: the context a request may reach (--max-model-len or the model's)
  std::string metrics_listen;     // empty: no Prometheus endpoint
  std::string metrics_port_file;
  std::vector<std::string> served_model_names;
  std::string generation_config = "auto";
  std::string chat_template;
  VllmFlags vllm;
  bool http_listen_given = false;
  bool kv_dtype_given = false;  // --kv-dtype on the command line (vLLM's --kv-cache-dtype must agree)
};

int RunServeRank0(ServeOptions o, MpiJob* job);

int RunServe(ServeOptions o) {
  // A server never dies of a write to a closed pipe or socket: the write fails instead. Under
  // mpirun this matters when the job is being torn down and the daemon that forwards a rank's
  // stderr has gone: the rank's last words ("engine failed: rank 1 ...") must not kill it
  // before its clients have been told.
  std::signal(SIGPIPE, SIG_IGN);
  if (absl::Status s = ApplyVllmFlags(o.vllm, o.http_listen_given, &o.model, &o.server.http.listen, &o.engine);
      !s.ok()) {
    return Fail(s);
  }
  auto dtype = DTypeFlag(o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  if (absl::Status s = FinishModelSpec(*dtype, o.load_format, &o.model); !s.ok()) return Fail(s);
  if (absl::Status s = ApplyVllmKvCacheDtype(o.vllm, o.kv_dtype_given, o.model, &o.engine); !s.ok()) return Fail(s);
  // Under mpirun: rank 0 serves, the other ranks run their shards (tools/mpi_job.h).
  auto job = MpiJob::Join(o.engine, o.model);
  if (!job.ok()) return Fail(job.status());
  if (*job != nullptr && (*job)->rank() != 0) return (*job)->RunWorker(o.engine, o.model);
  const int code = RunServeRank0(std::move(o), job->get());
  // A rank 0 that fails ends the job: the workers may be waiting for it in a collective.
  if (code != 0 && *job != nullptr) (*job)->Abort(code);
  return code;
}

// The serving flags that can be checked before the model loads.
absl::Status CheckServeFlags(ServeOptions* o) {
  if (!o->metrics_listen.empty()) {  // a bad address fails before the model loads
    RETURN_IF_ERROR(server::CheckMetricsListen(o->metrics_listen));
  } else if (!o->metrics_port_file.empty()) {
    return absl::InvalidArgumentError("--metrics-port-file needs --metrics-listen");
  }
  if (o->max_metadata_bytes < 1024 || o->max_metadata_bytes > (256 << 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-metadata-bytes must be in [1024, 262144], got ", o->max_metadata_bytes));
  }
  for (const std::string& name : o->served_model_names) {
    if (name.empty()) return absl::InvalidArgumentError("--served-model-name: a name is empty");
  }
  // The transport's own limit, far enough above ours that an oversized call reaches the service
  // and is refused alone (server_main.h), and bounded so that headers cannot take much memory.
  o->server.transport_metadata_bytes = static_cast<int>(8 * o->max_metadata_bytes);
  o->server.http.server.max_body_bytes = static_cast<size_t>(o->server.max_message_bytes);
  o->server.http.served_model_names = o->served_model_names;
  if (o->served_model_names.empty()) {
    o->server.http.served_model_names = {!o->model.model_dir.empty() ? o->model.model_dir
                                                                     : absl::StrCat("moeserve-", o->model.preset)};
  }
  return absl::OkStatus();
}

// The checkpoint's tokenizer, or --chat-template's in place of its template (as vLLM's flag).
absl::StatusOr<ModelTokenizer> LoadServeTokenizer(const ServeOptions& o, const ModelConfig& c) {
  ASSIGN_OR_RETURN(ModelTokenizer text, LoadModelTokenizer(o.model, c.vocab_size));
  if (!o.chat_template.empty()) {
    auto source = ReadFileToString(o.chat_template);
    if (!source.ok()) return absl::InvalidArgumentError(absl::StrCat("--chat-template: ", source.status().message()));
    RETURN_IF_ERROR(text.SetChatTemplate(*std::move(source), "--chat-template " + o.chat_template));
  }
  return text;
}

void LogFlashTier(const EngineConfig& ecfg, const Engine& engine) {
  if (ecfg.kv_tiers.flash_dir.empty()) return;
  const FlashStoreStats f = engine.GetStats().tiers.flash;
  std::fprintf(stderr,
               "moeserve: flash tier %s: %lld records (%.1f MiB) of this model; left in place: %lld records of "
               "other models or formats, %lld other entries%s; dropped %lld damaged\n",
               ecfg.kv_tiers.flash_dir.c_str(), static_cast<long long>(f.records), f.bytes / 1048576.0,
               static_cast<long long>(f.skipped_foreign), static_cast<long long>(f.skipped_other),
               f.skipped_foreign > 0 ? " (--flash-kv-purge-foreign deletes the records)" : "",
               static_cast<long long>(f.dropped_corrupt + f.dropped_truncated + f.dropped_incomplete +
                                      f.dropped_foreign));
}

// GetModelInfo's static part: the model and its KV capacity (the service adds the layout as it
// is at each call: re-placements move the experts).
void FillModelInfo(const ServeOptions& o, const Launched& l, v1::ModelInfo* mi) {
  const ModelConfig& c = l.rank.weights->config();
  const Engine& engine = *l.engine;
  const EngineConfig& ecfg = l.config;
  mi->set_model(DescribeModelSpec(o.model));
  mi->set_config_json(c.ToJson());
  mi->set_dtype(std::string(DTypeShortName(l.rank.weights->dtype())));
  mi->set_total_params(c.TotalParams());
  mi->set_active_params(c.ActiveParams());
  mi->set_backend(l.rank.backend->Name());
  mi->set_num_layers(static_cast<int32_t>(c.num_hidden_layers));
  mi->set_num_experts(static_cast<int32_t>(c.num_local_experts));
  mi->set_experts_per_token(static_cast<int32_t>(c.num_experts_per_tok));
  mi->set_vocab_size(static_cast<int32_t>(c.vocab_size));
  mi->set_max_context(static_cast<int32_t>(c.max_position_embeddings));
  auto* kv = mi->mutable_kv_capacity();
  kv->set_blocks(engine.num_kv_blocks());
  kv->set_block_size(ecfg.block_size);
  kv->set_tokens(engine.num_kv_blocks() * ecfg.block_size);
  kv->set_bytes(static_cast<int64_t>(engine.num_kv_blocks() *
                                     KvLayoutFor(c, 1, ecfg.block_size, ecfg.kv_dtype).BlockBytes()));
  kv->set_dtype(std::string(DTypeShortName(ecfg.kv_dtype)));
  kv->set_ddr_bytes(static_cast<int64_t>(ecfg.kv_tiers.host_bytes));
  kv->set_preemption(ecfg.kv_tiers.enabled() ? PreemptionModeName(ecfg.kv_tiers.preemption) : "recompute");
  if (!ecfg.kv_tiers.flash_dir.empty()) {
    kv->set_flash_dir(ecfg.kv_tiers.flash_dir);
    kv->set_flash_bytes(static_cast<int64_t>(ecfg.kv_tiers.flash_bytes));
  }
}

// Starts the engine and the metrics endpoint, and serves until a shutdown signal.
int StartAndServe(ServeOptions o, const server::ServiceOptions& so, Engine* engine, MpiJob* job) {
  engine->Start();
  std::unique_ptr<server::MetricsExporter> metrics;  // scraped until the server returns
  if (!o.metrics_listen.empty()) {
    auto m = server::MetricsExporter::Start(o.metrics_listen, engine);
    if (!m.ok()) {
      engine->Stop();
      return Fail(m.status());
    }
    metrics = std::move(*m);
    const std::string host = o.metrics_listen.substr(0, o.metrics_listen.rfind(':'));
    std::fprintf(stderr, "moeserve: Prometheus metrics on http://%s:%d/metrics\n", host.c_str(), metrics->port());
    o.server.extra_port_file = o.metrics_port_file;
    o.server.extra_port = metrics->port();
  }
  if (job != nullptr) o.server.on_shutdown_signal = [job] { job->ShutdownRequested(); };
  absl::Status s = server::RunServer(o.server, so, engine);
  if (!s.ok()) {
    engine->Stop();
    return Fail(s);
  }
  if (absl::Status w = WriteExpertLoadOut(o.engine, *engine, o.model); !w.ok()) return Fail(w);
  return 0;
}

int RunServeRank0(ServeOptions o, MpiJob* job) {
  if (absl::Status s = CheckServeFlags(&o); !s.ok()) return Fail(s);
  auto api_keys = server::ApiKeys::FromFlags(o.api_key, o.api_keys_file);
  if (!api_keys.ok()) return Fail(api_keys.status());
  auto base = MakeEngineConfig(o.engine);
  if (!base.ok()) return Fail(base.status());
  // (max_tokens' default bound is the context, known once the model is: a placeholder to check
  // the other limits now.)
  base->limits.max_tokens = o.max_tokens_limit > 0 ? o.max_tokens_limit : std::numeric_limits<int32_t>::max();
  if (absl::Status s = base->limits.Validate(); !s.ok()) return Fail(s);
  const FitToModel fit = [&o](const ModelConfig& c, EngineConfig* e) -> absl::Status {
    if (e->limits.max_model_len > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("--max-model-len ", e->limits.max_model_len,
                                                     " exceeds the model's context of ", c.max_position_embeddings));
    }
    RETURN_IF_ERROR(FitModelLenToKvCache(c, e));
    // As vLLM: max_tokens is bounded by the context a sequence may reach, unless a lower limit is set.
    if (o.max_tokens_limit == 0) e->limits.max_tokens = e->limits.Context(c);
    return absl::OkStatus();
  };
  Stopwatch sw;
  auto launched = LaunchEngine(o.engine, o.model, *std::move(base), job, "moeserve: ", fit);
  if (!launched.ok()) return Fail(launched.status());
  Engine* engine = (*launched)->engine.get();
  const EngineConfig& ecfg = (*launched)->config;
  auto text = LoadServeTokenizer(o, (*launched)->rank.weights->config());
  if (!text.ok()) return Fail(text.status());
  std::fprintf(stderr, "moeserve: tokenizer: %s\n", text->Describe().c_str());
  std::fprintf(stderr, "moeserve: ready in %.2f s: KV cache %lld blocks of %lld tokens\n", sw.Seconds(),
               static_cast<long long>(engine->num_kv_blocks()), static_cast<long long>(ecfg.block_size));
  LogFlashTier(ecfg, *engine);
  server::ServiceOptions so;
  so.api_keys = *std::move(api_keys);
  so.max_metadata_bytes = o.max_metadata_bytes;
  so.limits = ecfg.limits;
  auto defaults = ReadGenerationDefaults(o.generation_config, o.model.model_dir);
  if (!defaults.ok()) return Fail(defaults.status());
  if (!defaults->source.empty()) {
    std::fprintf(stderr, "moeserve: %s: %s for OpenAI API requests (--generation-config vllm: none)\n",
                 defaults->source.c_str(), defaults->Describe().c_str());
  }
  so.generation_defaults = *std::move(defaults);
  so.tokenizer = std::make_shared<const ModelTokenizer>(*std::move(text));
  FillModelInfo(o, **launched, &so.model_info);
  return StartAndServe(std::move(o), so, engine, job);
}

}  // namespace

namespace {

// The gRPC server: address, keys, TLS, message limits, the drain.
void AddGrpcServerFlags(CLI::App* cmd, ServeOptions* o) {
  cmd->add_option("--listen", o->server.listen, "Address to listen on, host:port (port 0 picks a free one)")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require \"authorization: Bearer KEY\" on every moeserve.v1 call (one tenant)");
  cmd->add_option("--api-keys-file", o->api_keys_file,
                  "Require one of the keys in this file, one \"TENANT KEY\" line each ('#' comments; mode 600): "
                  "requests share prefix-cache blocks, and learn of cached prompts, only within their tenant "
                  "(and their request's cache_salt). Excludes --api-key");
  cmd->add_option("--tls-cert", o->server.tls_cert, "PEM certificate chain; with --tls-key enables TLS");
  cmd->add_option("--tls-key", o->server.tls_key, "PEM private key for --tls-cert");
  cmd->add_option("--max-message-bytes", o->server.max_message_bytes, "Largest request or response message")
      ->capture_default_str();
  cmd->add_option("--max-metadata-bytes", o->max_metadata_bytes,
                  "Largest request metadata (headers) a call may carry, counted as HPACK does (name + value + "
                  "32 per entry); a larger call gets RESOURCE_EXHAUSTED alone, its connection's other streams "
                  "go on. Past 8 times this the transport refuses it, and with gRPC 1.51 that ends its connection")
      ->capture_default_str();
  cmd->add_option("--grace-seconds", o->server.grace_seconds,
                  "On SIGTERM/SIGINT, how long running requests may finish before they are cancelled")
      ->capture_default_str();
  cmd->add_option("--port-file", o->server.port_file, "Write the bound port to this file once listening");
}

// The HTTP server's connections and timeouts.
void AddHttpServerFlags(CLI::App* cmd, server::HttpServerOptions& hs) {
  cmd->add_option("--http-threads", hs.threads,
                  "Event loops of the HTTP server (every connection, idle or streaming, is served by one of "
                  "them without holding a thread)")
      ->capture_default_str();
  cmd->add_option("--http-max-connections", hs.max_connections, "HTTP connections open at once, in all")
      ->capture_default_str();
  cmd->add_option("--http-max-connections-per-address", hs.max_connections_per_address,
                  "HTTP connections open at once from one client address")
      ->capture_default_str();
  cmd->add_option("--http-header-timeout", hs.header_timeout_seconds,
                  "Seconds a client has from connecting to the end of its request headers (slow-header clients "
                  "are closed)")
      ->capture_default_str();
  cmd->add_option("--http-body-timeout", hs.body_timeout_seconds,
                  "Seconds a client has from its headers to the end of its request body")
      ->capture_default_str();
  cmd->add_option("--http-idle-timeout", hs.idle_timeout_seconds,
                  "Seconds an HTTP connection may stay silent (between keep-alive requests) before it is closed")
      ->capture_default_str();
  cmd->add_option("--http-backlog", hs.backlog,
                  "Connections the kernel queues before the server accepts them (a burst beyond it is reset)")
      ->capture_default_str();
}

// The served model's names, template, defaults and limits, and the metrics endpoint.
void AddServedModelFlags(CLI::App* cmd, ServeOptions* o) {
  cmd->add_option("--chat-template", o->chat_template,
                  "A Jinja chat template file that replaces the checkpoint's (tokenizer_config.json's "
                  "chat_template); refused at start if it uses what moeserve's Jinja subset does not implement "
                  "(docs/tokenizers.md)");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "The model's ids in /v1/models and in requests' \"model\", as vLLM's: one or more, the first "
                  "the default (default: the checkpoint directory, or moeserve-PRESET)");
  cmd->add_option("--metrics-listen", o->metrics_listen,
                  "Serve Prometheus metrics (text format) at http://HOST:PORT/metrics (HOST an IPv4 address): request, token, preemption "
                  "and KV-tier counters, queue and KV gauges, latency histograms (queue, TTFT, TPOT, end to end, "
                  "step); port 0 picks a free one (empty: off)");
  cmd->add_option("--metrics-port-file", o->metrics_port_file,
                  "Write the metrics port to this file once serving (with --port-file's, after the signal handlers)");
  cmd->add_option("--max-tokens-limit", o->max_tokens_limit,
                  "Largest max_tokens a request may ask (0: as vLLM, what the context leaves: --max-model-len, or the "
                  "model's max_position_embeddings)")
      ->capture_default_str();
  AddVllmFlags(cmd, &o->vllm);
  cmd->add_option("--generation-config", o->generation_config,
                  "As vLLM's: auto takes the checkpoint's generation_config.json temperature, top_p, top_k, min_p, "
                  "repetition_penalty and max_new_tokens as defaults of OpenAI API requests that leave them out; vllm takes none; a "
                  "directory takes its generation_config.json")
      ->capture_default_str();
  cmd->add_option("--seed", o->engine.config.seed,
                  "Seeds the sampling of requests that bring no seed of their own, with their request number (as "
                  "vLLM's --seed): the same seed and requests in the same order sample the same tokens")
      ->capture_default_str();
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over gRPC (moeserve.v1.Moeserve, health, reflection)");
  AddModelFlags(cmd, &o->model, &o->dtype, &o->load_format);
  AddEngineFlags(cmd, &o->engine);
  AddGrpcServerFlags(cmd, o.get());
  CLI::Option* http_listen = cmd->add_option("--http-listen", o->server.http.listen,
                  "Serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
                  "/health, /metrics, /tokenize, /detokenize) on HOST:PORT; port 0 picks a free one; empty: off")
      ->capture_default_str();
  cmd->add_option("--http-port-file", o->server.http_port_file, "Write the HTTP API's bound port to this file");
  AddHttpServerFlags(cmd, o->server.http.server);
  AddServedModelFlags(cmd, o.get());
  GroupServeFlags(cmd);
  cmd->callback([o, exit_code, http_listen, cmd] {
    o->http_listen_given = http_listen->count() > 0;
    o->kv_dtype_given = cmd->get_option("--kv-dtype")->count() > 0;
    *exit_code = RunServe(*o);
  });
}

}  // namespace moeserve::tools
