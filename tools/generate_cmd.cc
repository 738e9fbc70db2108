// `moeserve generate`: runs one prompt through the model and prints the text and its timing.
#include <cstdio>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/clock.h"
#include "engine/generator.h"
#include "kernels/cpu/cpu_backend.h"
#include "engine/model_loader.h"
#include "models/stream_detokenizer.h"
#include "tools/commands.h"

namespace moeserve::tools {
namespace {

struct GenerateOptions {
  ModelSpec model = DefaultModelSpec();
  std::string dtype;
  std::string load_format = "auto";
  std::string prompt = "The future of inference is";
  std::string prompt_ids;
  int32_t max_tokens = 64;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::string stop_ids;
  bool ids = false;
  bool reference = false;
  int threads = 0;
  CpuKernelFlags cpu_kernel;
  int64_t block_size = 16;
  std::string kv_dtype = "f32";
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

int RunGenerate(GenerateOptions o) {
  if (absl::Status s = FinishModelSpec(o.dtype, o.load_format, &o.model); !s.ok()) return Fail(s);
  GenerationRequest req;
  req.max_tokens = o.max_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_k = o.top_k;
  req.sampling.top_p = o.top_p;
  req.sampling.seed = o.seed;
  if (absl::Status s = req.sampling.Validate(); !s.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--", s.message())));
  if (o.max_tokens < 1) return Fail(absl::InvalidArgumentError(absl::StrCat("--max-tokens must be >= 1, got ", o.max_tokens)));
  auto stop = ParseIds("--stop-ids", o.stop_ids);
  if (!stop.ok()) return Fail(stop.status());
  req.stop_ids = *stop;
  auto kv_dtype = DTypeFromShortName(o.kv_dtype);
  if (!kv_dtype.ok() || *kv_dtype == DType::kF16) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--kv-dtype must be f32 or bf16, got \"", o.kv_dtype, "\"")));
  }

  CpuBackendOptions bo;
  bo.path = o.reference ? CpuPath::kReference : CpuPath::kFast;
  bo.num_threads = o.threads;
  if (absl::Status s = ApplyCpuKernelFlags(o.cpu_kernel, &bo); !s.ok()) return Fail(s);
  CpuBackend backend(bo);
  Stopwatch load_sw;
  std::fprintf(stderr, "loading %s on %s ...\n", DescribeModelSpec(o.model).c_str(), backend.Name().c_str());
  auto weights = LoadModel(o.model, &backend);
  if (!weights.ok()) return Fail(weights.status());
  const ModelConfig& c = (*weights)->config();
  std::fprintf(stderr, "loaded in %.2f s: %.1fM parameters (%.1fM active), %s weights, %.0f MiB\n",
               load_sw.Seconds(), c.TotalParams() / 1e6, c.ActiveParams() / 1e6,
               std::string(DTypeShortName((*weights)->dtype())).c_str(), (*weights)->total_bytes() / 1048576.0);

  auto text = LoadModelTokenizer(o.model, c.vocab_size);
  if (!text.ok()) return Fail(text.status());
  req.stop_ids.insert(req.stop_ids.end(), text->eos_ids.begin(), text->eos_ids.end());
  if (!o.prompt_ids.empty()) {
    auto ids = ParseIds("--prompt-ids", o.prompt_ids);
    if (!ids.ok()) return Fail(ids.status());
    req.prompt = *ids;
  } else {
    auto ids = text->tokenizer->Encode(o.prompt, true);
    if (!ids.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--prompt: ", ids.status().message())));
    req.prompt = *ids;
  }
  if (req.prompt.empty()) return Fail(absl::InvalidArgumentError("--prompt-ids: the prompt is empty"));
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")")));
    }
  }
  const int64_t context = std::min<int64_t>(c.max_position_embeddings, static_cast<int64_t>(req.prompt.size()) + o.max_tokens);
  if (static_cast<int64_t>(req.prompt.size()) >= c.max_position_embeddings) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("prompt of ", req.prompt.size(),
                                                        " tokens exceeds the context of ", c.max_position_embeddings)));
  }
  const int64_t blocks = (context + o.block_size - 1) / o.block_size;
  auto kv = KvStorage::Create(&backend, KvLayoutFor(c, blocks, o.block_size, *kv_dtype));
  if (!kv.ok()) return Fail(kv.status());
  BlockPool pool(blocks);
  MoeModel model(weights->get(), &backend);
  Generator gen(&model, &*kv, &pool);

  StreamDetokenizer dec(text->tokenizer.get(), req.prompt);
  bool first = true;
  auto on_token = [&](size_t, int32_t t) {
    if (o.ids) {
      std::printf("%s%d", first ? "" : ",", t);
    } else {
      std::fputs(dec.Push(t).c_str(), stdout);
    }
    first = false;
    std::fflush(stdout);
  };
  GenerationTiming timing;
  auto results = gen.Run({req}, on_token, &timing);
  if (!results.ok()) return Fail(results.status());
  if (!o.ids) std::fputs(dec.Flush().c_str(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  const auto& r = (*results)[0];
  std::fprintf(stderr,
               "prompt %zu tokens, generated %zu (%s) | prefill %.1f tokens/s | decode %.1f tokens/s, "
               "%.2f ms per step\n",
               req.prompt.size(), r.tokens.size(), r.finish_reason.c_str(),
               timing.prefill_tokens / std::max(timing.prefill_seconds, 1e-9),
               timing.decode_tokens / std::max(timing.decode_seconds, 1e-9),
               timing.decode_steps ? 1e3 * timing.decode_seconds / timing.decode_steps : 0.0);
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text for one prompt and print it with a timing line");
  AddModelFlags(cmd, &o->model, &o->dtype, &o->load_format);
  cmd->add_option("--prompt", o->prompt, "Prompt text (byte tokenizer, BOS prepended)")->capture_default_str();
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids, e.g. 256,72,105 (overrides --prompt)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling: smallest set with this probability mass, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed: the same seed gives the same tokens");
  cmd->add_option("--stop-ids", o->stop_ids, "Comma-separated token ids that end generation (EOS always does)");
  cmd->add_flag("--ids", o->ids, "Print generated token ids instead of text");
  cmd->add_flag("--reference", o->reference, "Use the CPU reference path (slow, the test oracle)");
  cmd->add_option("--threads", o->threads, "CPU threads (0: one per hardware thread)")->capture_default_str();
  AddCpuKernelFlags(cmd, &o->cpu_kernel);
  cmd->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache dtype: f32 or bf16")->capture_default_str();
  cmd->callback([o, exit_code] { *exit_code = RunGenerate(*o); });
}

}  // namespace moeserve::tools
