// The OpenAI-compatible HTTP API's routes and lifecycle.
#include "server/http_api.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "text/tokenizer.h"
#include "server/generate_reactor.h"
#include "server/http_completions.h"
#include "server/json_body.h"
#include "core/status.h"
#include "server/metrics_exporter.h"
#include "server/openai_protocol.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

void Reply(HttpReply& reply, const absl::Status& status) {
  const ApiError e = ToApiError(status);
  reply.Send(e.http_status, "application/json", JsonText(e.ToJson()));
}
void ReplyJson(HttpReply& reply, const Json& j) { reply.Send(200, "application/json", JsonText(j)); }

std::string ErrorBody(int status, const std::string& message) {
  ApiError e;
  e.http_status = status;
  e.message = message;
  e.type = status == 413 ? "invalid_request_error" : status == 503 ? "server_error" : "not_found_error";
  return JsonText(e.ToJson());
}

// vLLM's /v1/models: every served name, each serving the first.
Json ModelsList(const std::vector<std::string>& names, int64_t max_model_len) {
  Json data = Json::array();
  for (const std::string& name : names) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "moeserve"},
                    {"root", names.front()},  // as vLLM: what the names serve
                    {"parent", nullptr},
                    {"max_model_len", max_model_len}});
  }
  return {{"object", "list"}, {"data", data}};
}

// vLLM's /tokenize: a prompt, or chat messages rendered as the chat endpoint renders them.
void Tokenize(const ModelTokenizer& tok, int64_t max_model_len, const HttpRequest& req, HttpReply& reply) {
  auto j = ParseJsonBody(req.body);
  if (!j.ok()) return Reply(reply, j.status());
  absl::StatusOr<std::vector<int32_t>> ids;
  if (j->is_object() && j->contains("prompt") && (*j)["prompt"].is_string()) {
    const bool special = !j->contains("add_special_tokens") || (*j)["add_special_tokens"] != false;
    ids = tok.tokenizer->Encode((*j)["prompt"].get<std::string>(), special);
  } else if (j->is_object() && j->contains("messages") && (*j)["messages"].is_array()) {
    absl::StatusOr<ChatOptions> options = ReadChatOptions(*j);
    ids = options.ok() ? ChatPrompt((*j)["messages"], tok, *options) : options.status();
  } else {
    ids = absl::InvalidArgumentError("prompt: give \"prompt\" (a string) or \"messages\"");
  }
  if (!ids.ok()) return Reply(reply, ids.status());
  ReplyJson(reply, {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", max_model_len}});
}

// vLLM's /detokenize.
void Detokenize(const ModelTokenizer& tok, const HttpRequest& req, HttpReply& reply) {
  auto j = ParseJsonBody(req.body);
  if (!j.ok()) return Reply(reply, j.status());
  if (!j->is_object() || !j->contains("tokens") || !(*j)["tokens"].is_array()) {
    return Reply(reply, absl::InvalidArgumentError("tokens: must be an array of token ids"));
  }
  if (!tok.has_text()) {
    return Reply(reply, absl::InvalidArgumentError("tokens: the server runs without a tokenizer (--skip-tokenizer-init)"));
  }
  std::vector<int32_t> ids;
  for (const Json& v : (*j)["tokens"]) {
    int64_t id = -1;
    if (!v.is_number_integer() || !v.get_to(id) || id < 0 || id > INT32_MAX) {
      return Reply(reply, absl::InvalidArgumentError("tokens: must be an array of token ids"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  ReplyJson(reply, {{"prompt", tok.tokenizer->Decode(ids, true)}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(const HttpOptions& options, Engine* engine,
                                                        const ServiceOptions& service, DrainGate* gate) {
  std::unique_ptr<HttpApi> api(new HttpApi());
  api->options_ = options;
  api->engine_ = engine;
  api->service_ = service;
  api->gate_ = gate;
  api->streams_ = std::make_shared<OpenStreams>();
  api->encoder_ = std::make_unique<StreamEncoder>();
  HttpServerOptions so = options.server;
  so.listen = options.listen;
  so.error_body = ErrorBody;
  ASSIGN_OR_RETURN(api->server_, HttpServer::Start(so, api->Routes()));
  return api;
}

HttpApi::~HttpApi() {
  EndOpenStreams("the server is shutting down");
  server_.reset();   // no handler runs after this
  encoder_.reset();  // what is queued is written (into replies nobody reads)
}

void HttpApi::EndOpenStreams(const std::string& why) { streams_->EndAll(why); }

std::vector<HttpRoute> HttpApi::Routes() {
  // The caller's tenant, or nullopt when a key is required and missing or wrong.
  auto tenant = [this](const HttpRequest& req) -> std::optional<std::string> {
    const std::string value = req.Header("authorization");
    if (value.empty()) return service_.api_keys.Authenticate(nullptr);
    const absl::string_view view(value);
    return service_.api_keys.Authenticate(&view);
  };
  // Checked on the headers, before a byte of the body is read.
  auto authorized = [tenant](const HttpRequest& req, HttpReply& reply) {
    if (tenant(req).has_value()) return true;
    Reply(reply, absl::UnauthenticatedError("missing or wrong \"Authorization: Bearer <key>\""));
    return false;
  };
  const std::vector<std::string> model_names = options_.served_model_names;
  const ModelConfig& config = engine_->model_config();

  auto completion = [this, tenant, model_names](bool chat) {
    return [this, tenant, model_names, chat](const HttpRequest& req, std::shared_ptr<HttpReply> reply) {
      if (!gate_->TryEnter()) return Reply(*reply, absl::UnavailableError("the server is shutting down"));
      auto leave = [gate = gate_] { gate->Leave(); };
      auto parsed = ParseCompletion(req.body, chat, engine_->model_config(), service_.limits, service_.tokenizer,
                                    service_.generation_defaults);
      if (!parsed.ok()) {
        Reply(*reply, parsed.status());
        return leave();
      }
      if (!parsed->model.empty() &&
          std::find(model_names.begin(), model_names.end(), parsed->model) == model_names.end()) {
        Reply(*reply, absl::NotFoundError(absl::StrCat("model: no model named \"", parsed->model,
                                                       "\"; this server serves \"",
                                                       absl::StrJoin(model_names, "\", \""), "\"")));
        return leave();
      }
      if (parsed->model.empty()) parsed->model = model_names.front();
      parsed->system_fingerprint = absl::StrFormat("fp_%016x", engine_->fingerprint());
      parsed->request.cache_tenant = tenant(req).value_or("");
      RunCompletion(engine_, encoder_.get(), streams_.get(), *std::move(parsed), std::move(reply), leave);
    };
  };
  // The length a sequence may reach: --max-model-len where set, else the model's context.
  const int64_t max_model_len = service_.limits.max_model_len > 0
                                    ? std::min<int64_t>(service_.limits.max_model_len, config.max_position_embeddings)
                                    : config.max_position_embeddings;
  std::vector<HttpRoute> routes;
  routes.push_back({"POST", "/v1/completions", authorized, completion(false)});
  routes.push_back({"POST", "/v1/chat/completions", authorized, completion(true)});
  routes.push_back({"GET", "/v1/models", authorized,
                    [model_names, max_model_len](const HttpRequest&, std::shared_ptr<HttpReply> reply) {
                      ReplyJson(*reply, ModelsList(model_names, max_model_len));
                    }});
  // /health, and vLLM's /ping (GET or POST) for load balancers that probe that: 503 once draining.
  const auto health = [this](const HttpRequest&, std::shared_ptr<HttpReply> reply) {
    reply->Send(gate_->draining() ? 503 : 200, "application/json",
                gate_->draining() ? R"({"status":"draining"})" : R"({"status":"ok"})");
  };
  routes.push_back({"GET", "/health", nullptr, health});
  routes.push_back({"GET", "/ping", nullptr, health});
  routes.push_back({"POST", "/ping", nullptr, health});
  // vLLM's /version.
  routes.push_back({"GET", "/version", nullptr, [](const HttpRequest&, std::shared_ptr<HttpReply> reply) {
                      ReplyJson(*reply, {{"version", MOESERVE_VERSION}});
                    }});
  routes.push_back({"GET", "/metrics", nullptr, [this](const HttpRequest&, std::shared_ptr<HttpReply> reply) {
                      reply->Send(200, "text/plain; version=0.0.4", EngineMetricsText(engine_->GetStats()));
                    }});
  routes.push_back({"POST", "/tokenize", authorized,
                    [max_model_len, tok = service_.tokenizer](const HttpRequest& req, std::shared_ptr<HttpReply> reply) {
                      Tokenize(*tok, max_model_len, req, *reply);
                    }});
  routes.push_back({"POST", "/detokenize", authorized,
                    [tok = service_.tokenizer](const HttpRequest& req, std::shared_ptr<HttpReply> reply) {
                      Detokenize(*tok, req, *reply);
                    }});
  return routes;
}

}  // namespace moeserve::server
