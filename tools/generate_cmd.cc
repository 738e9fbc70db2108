// `moeserve generate`: one prompt through the engine the servers run (same request fields,
// defaults, validation and text handling), its text streamed to stdout and a timing line.
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "server/request_stream.h"
#include "tools/commands.h"
#include "tools/launch.h"

namespace moeserve::tools {
namespace {

struct GenerateOptions {
  ModelSpec model = DefaultModelSpec();
  std::string dtype;
  std::string load_format = "auto";
  EngineFlags engine;
  std::string prompt = "The future of inference is";
  std::string prompt_ids;
  int32_t max_tokens = static_cast<int32_t>(RequestLimits().default_max_tokens);
  SamplingParams sampling;
  std::string stop_ids;
  std::vector<std::string> stop;
  bool include_stop_str = false;
  bool ignore_eos = false;
  bool ids = false;
};

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(piece, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", piece, "\" is not an integer token id"));
    }
    ids.push_back(v);
  }
  return ids;
}

// The request as the servers would build it from these flags; the engine's Submit validates it
// (its messages name the request field, e.g. "max_tokens").
absl::StatusOr<GenerateRequest> MakeRequest(const GenerateOptions& o, const ModelTokenizer& text) {
  GenerateRequest r;
  r.max_tokens = o.max_tokens;
  r.sampling = o.sampling;
  if (!o.prompt_ids.empty()) {
    ASSIGN_OR_RETURN(r.prompt, ParseIds("--prompt-ids", o.prompt_ids));
  } else {
    auto ids = text.tokenizer->Encode(o.prompt, true);
    if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat("--prompt: ", ids.status().message()));
    r.prompt = *ids;
  }
  ASSIGN_OR_RETURN(r.stop_ids, ParseIds("--stop-ids", o.stop_ids));
  if (!o.ignore_eos) r.stop_ids.insert(r.stop_ids.end(), text.eos_ids.begin(), text.eos_ids.end());
  return r;
}

int RunGenerate(GenerateOptions o) {
  if (absl::Status s = FinishModelSpec(o.dtype, o.load_format, &o.model); !s.ok()) return Fail(s);
  if (absl::Status s = ResolveKvDtype(o.model, &o.engine.kv_dtype); !s.ok()) return Fail(s);
  auto ecfg = MakeEngineConfig(o.engine);
  if (!ecfg.ok()) return Fail(ecfg.status());
  const server::TextOptions text_options{o.stop, o.include_stop_str};
  if (absl::Status s = server::ValidateTextOptions(text_options); !s.ok()) return Fail(s);
  // One request may ask for the whole context (the servers bound it with --max-tokens-limit).
  const FitToModel fit = [](const ModelConfig& c, EngineConfig* e) {
    e->limits.max_tokens = std::max<int64_t>(e->limits.max_tokens, c.max_position_embeddings);
    return absl::OkStatus();
  };
  auto launched = LaunchEngine(o.engine, o.model, *std::move(ecfg), /*job=*/nullptr, "", fit);
  if (!launched.ok()) return Fail(launched.status());
  Engine* engine = (*launched)->engine.get();
  auto text = LoadModelTokenizer(o.model, engine->model_config().vocab_size);
  if (!text.ok()) return Fail(text.status());
  auto request = MakeRequest(o, *text);
  if (!request.ok()) return Fail(request.status());

  server::RequestStream stream(text->tokenizer.get(), request->prompt, text_options, *request);
  bool first = true;
  std::optional<uint64_t> id;
  auto submitted = engine->Submit(*request, [&](const RequestEvent& ev) {
    server::CompletionText piece;
    stream.Take(ev, &piece);
    if (id && stream.StopNow()) engine->Cancel(*id);  // a stop string: the rest is not wanted
    if (o.ids) {
      for (int32_t t : piece.token_ids) std::printf("%s%d", std::exchange(first, false) ? "" : ",", t);
    } else {
      std::fputs(piece.text.c_str(), stdout);
    }
    std::fflush(stdout);
  });
  if (!submitted.ok()) return Fail(submitted.status());
  id = *submitted;
  if (absl::Status s = engine->RunUntilIdle(); !s.ok()) return Fail(s);
  if (!o.ids) std::fputs(stream.FinishText().c_str(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  const absl::StatusOr<std::string> reason = stream.Outcome();
  if (!reason.ok()) return Fail(reason.status());
  const RequestEvent end = stream.Final();
  std::fprintf(stderr,
               "prompt %lld tokens, generated %lld (%s) | time to first token %.1f ms, prefill %.1f tokens/s | "
               "decode %.1f tokens/s, %.2f ms per token\n",
               static_cast<long long>(end.usage.prompt_tokens), static_cast<long long>(end.usage.completion_tokens),
               reason->c_str(), 1e3 * end.timing.ttft_seconds,
               end.usage.prompt_tokens / std::max(end.receipt.prefill_seconds, 1e-9),
               end.timing.tpot_seconds > 0 ? 1.0 / end.timing.tpot_seconds : 0.0, 1e3 * end.timing.tpot_seconds);
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text for one prompt on the engine the servers run, and print it with a timing line");
  AddModelFlags(cmd, &o->model, &o->dtype, &o->load_format);
  cmd->add_option("--prompt", o->prompt, "Prompt text (the model's tokenizer, with its special tokens)")
      ->capture_default_str();
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids, e.g. 256,72,105 (overrides --prompt)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most (the servers' default)")->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus sampling: smallest set with this probability mass, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Drop tokens less likely than this times the most likely one, in [0, 1]")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty, "vLLM's presence penalty, in [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty, "vLLM's frequency penalty, in [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", o->sampling.repetition_penalty, "vLLM's repetition penalty, in (0, 100] (1: off)")
      ->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Sampling seed: the same seed gives the same tokens");
  cmd->add_option("--stop-ids", o->stop_ids, "Comma-separated token ids that end generation (EOS always does)");
  cmd->add_option("--stop", o->stop, "A stop string (repeat the flag for more): the text is cut before the first one");
  cmd->add_flag("--include-stop-str-in-output", o->include_stop_str, "Keep the stop string (and stop token's text)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past EOS");
  cmd->add_flag("--ids", o->ids, "Print generated token ids instead of text");
  AddEngineFlags(cmd, &o->engine);
  cmd->callback([o, exit_code] { *exit_code = RunGenerate(*o); });
}

}  // namespace moeserve::tools
