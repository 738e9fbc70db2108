// The OpenAI-compatible HTTP API's routes and lifecycle.
#include "server/http_api.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/tokenizer.h"
#include "server/generate_reactor.h"
#include "server/http_completions.h"
#include "server/metrics_exporter.h"
#include "server/openai_protocol.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

void Reply(httplib::Response& res, const absl::Status& status) {
  const ApiError e = ToApiError(status);
  res.status = e.http_status;
  res.set_content(e.ToJson().dump(), "application/json");
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(const HttpOptions& options, Engine* engine,
                                                        const ServiceOptions& service,
                                                        DrainGate* gate) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen must be HOST:PORT (port 0 picks a free one), got \"", options.listen, "\""));
  }
  if (options.threads < 1) return absl::InvalidArgumentError("--http-threads must be >= 1");
  std::unique_ptr<HttpApi> api(new HttpApi());
  api->options_ = options;
  api->engine_ = engine;
  api->service_ = service;
  api->gate_ = gate;
  api->server_ = std::make_unique<httplib::Server>();
  const int threads = options.threads;
  api->server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  api->server_->set_payload_max_length(options.max_body_bytes);
  api->Routes();
  const std::string host = options.listen.substr(0, colon);
  if (port == 0) {
    api->port_ = api->server_->bind_to_any_port(host);
  } else {
    api->port_ = api->server_->bind_to_port(host, port) ? port : -1;
  }
  if (api->port_ <= 0)
    return absl::UnavailableError(absl::StrCat("--http-listen: cannot listen on ", options.listen));
  HttpApi* raw = api.get();
  api->thread_ = std::thread([raw] { raw->server_->listen_after_bind(); });
  return api;
}

HttpApi::~HttpApi() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpApi::Routes() {
  httplib::Server& s = *server_;
  // The caller's tenant, or nullopt when a key is required and missing or wrong.
  auto tenant = [this](const httplib::Request& req) -> std::optional<std::string> {
    if (!req.has_header("Authorization")) return service_.api_keys.Authenticate(nullptr);
    const std::string value = req.get_header_value("Authorization");
    const absl::string_view view(value);
    return service_.api_keys.Authenticate(&view);
  };
  auto unauthorized = [](httplib::Response& res) {
    Reply(res, absl::UnauthenticatedError("missing or wrong \"Authorization: Bearer <key>\""));
  };
  const std::string model_name = options_.served_model_name;
  const ModelConfig& config = engine_->model_config();

  auto completion = [this, tenant, unauthorized, model_name](bool chat) {
    return [this, tenant, unauthorized, model_name, chat](const httplib::Request& req,
                                                          httplib::Response& res) {
      if (!gate_->TryEnter())
        return Reply(res, absl::UnavailableError("the server is shutting down"));
      auto leave = [gate = gate_] { gate->Leave(); };
      const auto who = tenant(req);
      if (!who.has_value()) {
        unauthorized(res);
        return leave();
      }
      auto parsed = ParseCompletion(req.body, chat, engine_->model_config(), service_.limits,
                                    service_.tokenizer);
      if (!parsed.ok()) {
        Reply(res, parsed.status());
        return leave();
      }
      if (!parsed->model.empty() && parsed->model != model_name) {
        Reply(res,
              absl::NotFoundError(absl::StrCat("model: no model named \"", parsed->model,
                                               "\"; this server serves \"", model_name, "\"")));
        return leave();
      }
      if (parsed->model.empty()) parsed->model = model_name;
      parsed->request.cache_tenant = *who;
      RunCompletion(engine_, *std::move(parsed), res, leave);
    };
  };
  s.Post("/v1/completions", completion(false));
  s.Post("/v1/chat/completions", completion(true));

  s.Get("/v1/models", [tenant, unauthorized, model_name, &config](const httplib::Request& req,
                                                                  httplib::Response& res) {
    if (!tenant(req).has_value()) return unauthorized(res);
    const Json model = {{"id", model_name},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "moeserve"},
                        {"max_model_len", config.max_position_embeddings}};
    res.set_content(Json({{"object", "list"}, {"data", Json::array({model})}}).dump(),
                    "application/json");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = gate_->draining() ? 503 : 200;
    res.set_content(gate_->draining() ? R"({"status":"draining"})" : R"({"status":"ok"})",
                    "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(EngineMetricsText(engine_->GetStats()), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", [tenant, unauthorized, &config, tok = service_.tokenizer](
                          const httplib::Request& req, httplib::Response& res) {
    if (!tenant(req).has_value()) return unauthorized(res);
    const Json j = Json::parse(req.body, nullptr, false);
    absl::StatusOr<std::vector<int32_t>> ids;
    if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      const bool special = !j.contains("add_special_tokens") || j["add_special_tokens"] != false;
      ids = tok->tokenizer->Encode(j["prompt"].get<std::string>(), special);
    } else if (j.is_object() && j.contains("messages") && j["messages"].is_array()) {
      // As the chat endpoint renders them (its template adds the special tokens).
      ids = ChatPrompt(j["messages"], *tok);
    } else {
      ids = absl::InvalidArgumentError("prompt: give \"prompt\" (a string) or \"messages\"");
    }
    if (!ids.ok()) return Reply(res, ids.status());
    res.set_content(Json({{"tokens", *ids},
                          {"count", ids->size()},
                          {"max_model_len", config.max_position_embeddings}})
                        .dump(),
                    "application/json");
  });
  s.Post(
      "/detokenize", [tenant, unauthorized, tok = service_.tokenizer](const httplib::Request& req,
                                                                       httplib::Response& res) {
        if (!tenant(req).has_value()) return unauthorized(res);
        const Json j = Json::parse(req.body, nullptr, false);
        if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
          return Reply(res, absl::InvalidArgumentError("tokens: must be an array of token ids"));
        }
        std::vector<int32_t> ids;
        for (const Json& v : j["tokens"]) {
          if (!v.is_number_integer())
            return Reply(res, absl::InvalidArgumentError("tokens: must be an array of token ids"));
          ids.push_back(v.get<int32_t>());
        }
        res.set_content(Json({{"prompt", tok->tokenizer->Decode(ids, true)}}).dump(), "application/json");
      });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      Reply(res, absl::NotFoundError(absl::StrCat("no route ", req.method, " ", req.path)));
    } else if (res.status == 413) {
      Reply(res, absl::InvalidArgumentError("body: the request body is larger than the limit"));
      res.status = 413;
    }
  });
}

}  // namespace moeserve::server
