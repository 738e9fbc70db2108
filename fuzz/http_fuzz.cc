// libFuzzer target over what the OpenAI HTTP API does with a request body before the engine
// sees it, and with the answer after: each input is one body, taken as the server takes it.
//   - ParseJsonBody (default limits, and tight ones), then IntInRange and UnsignedInt over every
//     value of the parsed object, checked against the value itself;
//   - ParseCompletion as /v1/completions and as /v1/chat/completions, with the byte tokenizer of
//     the tiny preset (moeserve's ChatML rendering) and with the same tokenizer given a Jinja
//     ChatML template: the two chat prompts must be the same ids;
//   - every refusal turned into the API's error object and serialised, as the server answers
//     (JsonText(ToApiError(...).ToJson()));
//   - an accepted request's answer built as the server builds it: the prompt's ids taken as if
//     generated (with logprobs when asked), streamed through StreamDetokenizer, cut at the stop
//     strings, then the completion object and the stream chunks serialised.
// Findings are crashes: a sanitizer report, an escaping exception (the server would
// std::terminate), or a broken property (abort with a message). Built by benchmarks/fuzz_http.sh,
// not by CMake (fuzz/README.md).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "text/model_tokenizer.h"
#include "text/stream_detokenizer.h"
#include "server/json_body.h"
#include "server/openai_protocol.h"

namespace {

using Json = nlohmann::json;
using moeserve::ModelConfig;
using moeserve::ModelTokenizer;
using moeserve::RequestLimits;
using moeserve::server::ParsedCompletion;

#define FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d): ", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fprintf(stderr, "\n");                                                          \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

// moeserve's ChatML rendering (openai_protocol.cc's RenderChat) as a Jinja template, with the
// BOS the byte tokenizer adds on the other path: both paths must give the same ids.
constexpr const char* kChatMl =
    "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Where the current input is (for naming an exception that escapes), and the refusal being
// serialised, if one is.
std::string g_stage, g_detail;

struct Stage {
  explicit Stage(std::string name) : saved(g_stage), exceptions(std::uncaught_exceptions()) {
    g_stage = std::move(name);
  }
  ~Stage() {
    if (std::uncaught_exceptions() == exceptions) g_stage = saved;  // kept while an exception unwinds
  }
  std::string saved;
  int exceptions;
};

struct Setup {
  ModelConfig config;
  RequestLimits limits;
  std::shared_ptr<const ModelTokenizer> bytes, templated;
};

const Setup& GetSetup() {
  static const Setup* setup = [] {
    auto* s = new Setup;
    auto config = moeserve::PresetConfig("tiny");
    if (!config.ok()) {
      std::fprintf(stderr, "PresetConfig(tiny): %s\n", std::string(config.status().message()).c_str());
      std::abort();
    }
    s->config = *config;
    s->bytes = std::make_shared<const ModelTokenizer>(ModelTokenizer::Bytes());
    ModelTokenizer t = ModelTokenizer::Bytes();
    const absl::Status st = t.SetChatTemplate(kChatMl, "fuzz ChatML");
    if (!st.ok()) {
      std::fprintf(stderr, "SetChatTemplate: %s\n", std::string(st.message()).c_str());
      std::abort();
    }
    s->templated = std::make_shared<const ModelTokenizer>(std::move(t));
    return s;
  }();
  return *setup;
}

// What the server sends for a refusal.
void Refusal(const absl::Status& status) {
  FUZZ_CHECK(!status.ok(), "a refusal without an error");
  Stage stage(g_stage + " / JsonText(ToApiError(...).ToJson())");
  g_detail = std::string(status.message());
  const moeserve::server::ApiError e = moeserve::server::ToApiError(status);
  const std::string body = moeserve::server::JsonText(e.ToJson());  // as the server answers
  g_detail.clear();
  FUZZ_CHECK(e.http_status >= 400 && e.http_status <= 599, "status %d", e.http_status);
  FUZZ_CHECK(!body.empty(), "empty error body");
}

// IntInRange and UnsignedInt over one value, against the value itself.
void CheckIntegers(const Json& v) {
  Stage stage("IntInRange");
  struct Range {
    int64_t lo, hi;
  };
  static constexpr Range kRanges[] = {{0, 2147483647},
                                      {-1, 2147483647},
                                      {0, 20},
                                      {1, 4096},
                                      {INT64_MIN, INT64_MAX},
                                      {-2147483648LL, 2147483647}};
  for (const Range& r : kRanges) {
    absl::StatusOr<int64_t> got = moeserve::server::IntInRange(v, "field", r.lo, r.hi);
    if (!got.ok()) {
      FUZZ_CHECK(got.status().code() == absl::StatusCode::kInvalidArgument, "IntInRange: not INVALID_ARGUMENT");
      FUZZ_CHECK(std::string(got.status().message()).rfind("field: ", 0) == 0, "IntInRange: the field is not named");
      // Refused only when it is not an integer in range.
      if (v.is_number_integer()) {
        if (v.is_number_unsigned()) {
          const uint64_t u = v.get<uint64_t>();
          FUZZ_CHECK(u > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(u) < r.lo ||
                         static_cast<int64_t>(u) > r.hi,
                     "IntInRange refused %llu in [%lld, %lld]", static_cast<unsigned long long>(u),
                     static_cast<long long>(r.lo), static_cast<long long>(r.hi));
        } else {
          const int64_t i = v.get<int64_t>();
          FUZZ_CHECK(i < r.lo || i > r.hi, "IntInRange refused %lld", static_cast<long long>(i));
        }
      }
      Refusal(got.status());
      continue;
    }
    FUZZ_CHECK(v.is_number_integer(), "IntInRange accepted a non-integer: %s", v.dump().c_str());
    FUZZ_CHECK(*got >= r.lo && *got <= r.hi, "IntInRange gave %lld outside [%lld, %lld]", static_cast<long long>(*got),
               static_cast<long long>(r.lo), static_cast<long long>(r.hi));
    if (v.is_number_unsigned()) {
      FUZZ_CHECK(static_cast<uint64_t>(*got) == v.get<uint64_t>(), "IntInRange changed %s", v.dump().c_str());
    } else {
      FUZZ_CHECK(*got == v.get<int64_t>(), "IntInRange changed %s", v.dump().c_str());
    }
  }
  absl::StatusOr<uint64_t> u = moeserve::server::UnsignedInt(v, "seed");
  if (u.ok()) {
    FUZZ_CHECK(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0), "UnsignedInt accepted %s",
               v.dump().c_str());
    FUZZ_CHECK(*u == v.get<uint64_t>(), "UnsignedInt changed %s", v.dump().c_str());
  } else {
    Refusal(u.status());
  }
}

void Walk(const Json& j, int depth) {
  CheckIntegers(j);
  if (depth > 80) return;  // ParseJsonBody bounds the depth at 64
  if (j.is_structured()) {
    for (const Json& child : j) Walk(child, depth + 1);
  }
}

// The answer the server would build for an accepted request: the prompt taken as generated.
void Answer(const ParsedCompletion& p) {
  Stage stage(g_stage + " / the answer");
  const moeserve::Tokenizer& tok = *p.tokenizer->tokenizer;
  std::vector<int32_t> generated(p.request.prompt.begin(),
                                 p.request.prompt.begin() + std::min<size_t>(p.request.prompt.size(), 64));
  // StreamDetokenizer without context gives what a whole decode gives.
  moeserve::StreamDetokenizer stream(&tok, {});
  std::string streamed;
  for (int32_t id : generated) streamed += stream.Push(id);
  streamed += stream.Flush();
  const std::string whole = tok.Decode(generated, true);
  FUZZ_CHECK(streamed == whole, "streamed \"%s\" != decoded \"%s\"", streamed.c_str(), whole.c_str());
  // With the prompt as context, as the server streams.
  moeserve::StreamDetokenizer in_context(&tok, p.request.prompt);
  moeserve::server::CompletionText out, delta;
  for (size_t i = 0; i < generated.size(); ++i) {
    out.token_ids.push_back(generated[i]);
    if (p.logprobs > 0) {
      std::vector<moeserve::TokenLogprob> top;
      for (int k = 0; k < p.logprobs; ++k) {
        top.push_back({generated[(i + static_cast<size_t>(k)) % generated.size()], -0.5f * static_cast<float>(k)});
      }
      out.logprobs.push_back(std::move(top));
    }
    out.text += in_context.Push(generated[i]);
  }
  out.text += in_context.Flush();
  const bool stopped = moeserve::server::CutAtStop(&out.text, p.text.stop);
  if (stopped) {
    for (const std::string& s : p.text.stop) FUZZ_CHECK(out.text.find(s) == std::string::npos, "a stop string survived the cut");
  }
  moeserve::RequestEvent ev;
  ev.finished = true;
  ev.tokens = generated;
  ev.usage.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
  ev.usage.completion_tokens = static_cast<int64_t>(generated.size());
  const std::string reason = stopped ? "stop" : "length";
  const std::string id = p.chat ? "chatcmpl-fuzz" : "cmpl-fuzz";
  std::string s = moeserve::server::JsonText(moeserve::server::CompletionObject(p, id, 1, out, reason, ev));
  FUZZ_CHECK(!s.empty(), "empty completion object");
  // A chunk's text is whole characters (the server's TextStream never splits one).
  size_t half = out.text.size() / 2;
  while (half > 0 && (static_cast<unsigned char>(out.text[half]) & 0xC0) == 0x80) --half;
  delta.text = out.text.substr(0, half);
  delta.token_ids = out.token_ids;
  delta.logprobs = out.logprobs;
  s = moeserve::server::JsonText(moeserve::server::ChunkObject(p, id, 1, delta, std::nullopt, true));
  s = moeserve::server::JsonText(moeserve::server::ChunkObject(p, id, 1, {}, reason, false));
  s = moeserve::server::JsonText(moeserve::server::UsageObject(ev));
}

// One endpoint's parse of the body, as the HTTP API's completion handler does it.
absl::StatusOr<ParsedCompletion> Parse(const std::string& body, bool chat,
                                       const std::shared_ptr<const ModelTokenizer>& tok) {
  const Setup& s = GetSetup();
  Stage stage(std::string("ParseCompletion ") + (chat ? tok->chat ? "chat (template)" : "chat" : "completions"));
  absl::StatusOr<ParsedCompletion> p = moeserve::server::ParseCompletion(body, chat, s.config, s.limits, tok);
  if (!p.ok()) {
    Refusal(p.status());
    return p;
  }
  const moeserve::GenerateRequest& r = p->request;
  FUZZ_CHECK(p->chat == chat, "chat flag");
  FUZZ_CHECK(!r.prompt.empty(), "an empty prompt was accepted");
  for (int32_t id : r.prompt) FUZZ_CHECK(id >= 0 && id < s.config.vocab_size, "prompt id %d", id);
  for (int32_t id : r.stop_ids) FUZZ_CHECK(id >= 0 && id < s.config.vocab_size, "stop id %d", id);
  FUZZ_CHECK(r.max_tokens >= 1 && r.max_tokens <= s.limits.max_tokens, "max_tokens %d", r.max_tokens);
  FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= s.limits.max_top_logprobs, "top_logprobs %d", r.top_logprobs);
  FUZZ_CHECK(p->logprobs == r.top_logprobs, "logprobs %d != top_logprobs %d", p->logprobs, r.top_logprobs);
  for (const std::string& stop : p->text.stop) FUZZ_CHECK(!stop.empty(), "an empty stop string");
  Answer(*p);
  return p;
}

// The whole of one input.
void Body(const std::string& body) {
  const Setup& s = GetSetup();
  g_detail.clear();

  // The JSON layer alone, with the server's limits and with tight ones.
  Stage stage("ParseJsonBody");
  absl::StatusOr<Json> j = moeserve::server::ParseJsonBody(body);
  if (j.ok()) {
    FUZZ_CHECK(j->is_object(), "ParseJsonBody accepted a non-object");
    Walk(*j, 0);
  } else {
    Refusal(j.status());
  }
  g_stage = "ParseJsonBody (tight limits)";
  absl::StatusOr<Json> tight = moeserve::server::ParseJsonBody(body, {.max_depth = 3, .max_values = 16});
  if (!tight.ok()) Refusal(tight.status());

  // The two endpoints.
  (void)Parse(body, /*chat=*/false, s.bytes);
  absl::StatusOr<ParsedCompletion> rendered = Parse(body, /*chat=*/true, s.bytes);
  absl::StatusOr<ParsedCompletion> templated = Parse(body, /*chat=*/true, s.templated);
  // moeserve's ChatML and the same format as a Jinja template agree on the prompt (or on why not).
  FUZZ_CHECK(rendered.ok() == templated.ok(), "ChatML rendering %s but the template %s",
             rendered.ok() ? "accepted" : std::string(rendered.status().message()).c_str(),
             templated.ok() ? "accepted" : std::string(templated.status().message()).c_str());
  if (rendered.ok()) {
    FUZZ_CHECK(rendered->request.prompt == templated->request.prompt,
               "ChatML rendering gives %zu ids, the template %zu", rendered->request.prompt.size(),
               templated->request.prompt.size());
  }
}

// The continue mode (MOESERVE_FUZZ_CONTINUE=DIR): an exception that escapes is a finding the
// server would die of, but the same one is found again within seconds and would end every run.
// In this mode it is caught instead; each new kind (the stage it escaped from and what it says,
// numbers and quoted input left out) is written once to DIR/exception-HASH and named on stderr,
// and the input is kept out of the corpus. Sanitizer reports and broken properties still end
// the run. Two throw sites in one stage with the same message count as one kind.
const char* g_continue_dir = nullptr;

std::string Signature(const std::string& what) {
  std::string out = g_stage + ": ";
  const size_t id_end = what.find(']');
  for (size_t i = 0; i < what.size(); ++i) {
    if (what.compare(i, 11, "last read: ") == 0 || what.compare(i, 10, "last byte:") == 0 ||
        what.compare(i, 9, "parsing '") == 0) {
      break;
    }
    if (id_end == std::string::npos || i <= id_end) {
      out += what[i];
    } else if (what.compare(i, 2, "0x") == 0) {
      out += "0x#";
      for (i += 2; i < what.size() && std::isxdigit(static_cast<unsigned char>(what[i])); ++i) {
      }
      --i;
    } else if (std::isdigit(static_cast<unsigned char>(what[i]))) {
      if (out.back() != '#') out += '#';
    } else {
      out += what[i];
    }
  }
  return out;
}

void RecordException(const std::string& body, const char* what) {
  static std::set<std::string>* seen = new std::set<std::string>;
  const std::string sig = Signature(what);
  if (!seen->insert(sig).second) return;
  const std::string path =
      std::string(g_continue_dir) + "/exception-" + std::to_string(std::hash<std::string>()(sig) % 1000000007);
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
  }
  std::fprintf(stderr, "NEW EXCEPTION (caught, continuing): %s\n  what(): %s\n  refusal: %s\n  input: %s (%zu bytes)\n",
               sig.c_str(), what, g_detail.c_str(), path.c_str(), body.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetSetup();
  // An exception escaping (outside the continue mode) ends in std::terminate, as in the server;
  // say where it escaped from before libFuzzer prints the stack of the throw.
  std::set_terminate([] {
    std::string what = "(not a std::exception)";
    try {
      if (std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "uncaught exception, what(): %s\nescaped from: %s%s%s\n", what.c_str(), g_stage.c_str(),
                 g_detail.empty() ? "" : " of: ", g_detail.c_str());
    std::abort();
  });
  const char* dir = std::getenv("MOESERVE_FUZZ_CONTINUE");
  if (dir != nullptr && *dir != '\0') g_continue_dir = dir;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  if (g_continue_dir == nullptr) {
    Body(body);
    return 0;
  }
  try {
    Body(body);
  } catch (const std::exception& e) {
    RecordException(body, e.what());
    g_stage.clear();
    g_detail.clear();
    return -1;  // not into the corpus
  }
  return 0;
}
