// `moeserve make-model`: writes a Hugging Face directory (config.json, safetensors with
// deterministic random weights, tokenizer.json, tokenizer_config.json with a chat template,
// generation_config.json).
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "text/tokenizer_files.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "models/host_matrix.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "models/weight_init.h"
#include "tools/commands.h"

namespace moeserve::tools {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string family = "mixtral";
  std::string config;  // a config.json whose shape and family replace the preset's
  uint64_t seed = 0;
  std::string dtype = "bf16";
  std::string quantization = "none";
  std::string out;
  double shard_mb = 0;
};

// The checkpoint's tensors with every linear weight (2-D, not the embedding, lm_head or router)
// as float8_e4m3fn plus its "<name>_scale_inv" of 128 x 128 block scales, as DeepSeek ships.
struct Fp8Checkpoint {
  std::vector<TensorView> views;
  std::vector<std::vector<uint8_t>> storage;
};
absl::StatusOr<Fp8Checkpoint> QuantizeLinearLayers(const std::vector<TensorView>& tensors) {
  Fp8Checkpoint out;
  out.storage.reserve(2 * tensors.size());
  for (const TensorView& t : tensors) {
    const bool linear = t.shape.size() == 2 && t.name != "model.embed_tokens.weight" && t.name != "lm_head.weight" &&
                        !absl::EndsWith(t.name, "mlp.gate.weight") && !absl::EndsWith(t.name, "block_sparse_moe.gate.weight") &&
                        !absl::EndsWith(t.name, "shared_expert_gate.weight");
    if (!linear) {
      out.views.push_back(t);
      continue;
    }
    ASSIGN_OR_RETURN(const HostMatrix m, ReadHostMatrix(t, nullptr));
    const HostMatrix q = QuantizeFp8(m);
    const int64_t groups = q.ScaleGroups(), blocks = (q.rows + kFp8ScaleCols - 1) / kFp8ScaleCols;
    std::vector<float> block_scales;
    for (int64_t b = 0; b < blocks; ++b) {
      block_scales.insert(block_scales.end(), q.scales.begin() + b * kFp8ScaleCols * groups,
                          q.scales.begin() + (b * kFp8ScaleCols + 1) * groups);
    }
    out.storage.push_back(q.bytes);
    TensorView w = t;
    w.dtype = DType::kF8E4M3;
    w.data = out.storage.back().data();
    w.bytes = out.storage.back().size();
    out.views.push_back(w);
    out.storage.emplace_back(block_scales.size() * sizeof(float));
    std::memcpy(out.storage.back().data(), block_scales.data(), out.storage.back().size());
    TensorView s{t.name + "_scale_inv", DType::kF32, {blocks, groups}, out.storage.back().data(), out.storage.back().size()};
    out.views.push_back(s);
  }
  return out;
}

// The checkpoint's config: a preset's shape as --family, or --config's file as it is.
absl::StatusOr<ModelConfig> MakeModelConfig(const MakeModelOptions& o) {
  if (!o.config.empty()) {
    auto config = ModelConfig::FromFile(o.config);
    // (FromFile refuses a vocabulary smaller than the byte-level tokenizer written beside it.)
    if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat("--config: ", config.status().message()));
    return config;
  }
  auto config = PresetConfig(o.preset);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat("--preset: ", config.status().message()));
  auto family = FamilyFromModelType(o.family);
  if (!family.ok()) return absl::InvalidArgumentError(absl::StrCat("--family: ", family.status().message()));
  return WithFamily(*config, *family);
}

int RunMakeModel(const MakeModelOptions& o) {
  auto config = MakeModelConfig(o);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const std::string shape = o.config.empty() ? absl::StrCat("preset ", o.preset) : o.config;
  auto dtype = DTypeFromShortName(o.dtype);
  if (!dtype.ok() || *dtype == DType::kF16) {
    std::fprintf(stderr, "error: --dtype must be f32 or bf16, got \"%s\"\n", o.dtype.c_str());
    return 2;
  }
  if (o.shard_mb < 0) {
    std::fprintf(stderr, "error: --shard-mb must be >= 0, got %g\n", o.shard_mb);
    return 2;
  }
  if (o.quantization != "none" && o.quantization != "fp8") {
    std::fprintf(stderr, "error: --quantization must be none or fp8, got \"%s\"\n", o.quantization.c_str());
    return 2;
  }
  config->torch_dtype = *dtype;
  config->fp8_checkpoint = o.quantization == "fp8";
  Stopwatch sw;
  std::fprintf(stderr, "make-model: generating %s (%.1fM parameters, %.1fM active) in %s, seed %llu...\n",
               shape.c_str(), config->TotalParams() / 1e6, config->ActiveParams() / 1e6,
               o.dtype.c_str(), static_cast<unsigned long long>(o.seed));
  ThreadPool pool(0);
  auto tensors = GenerateRandomWeights(*config, o.seed, *dtype, &pool);
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) {
    std::fprintf(stderr, "error: --out: cannot create %s: %s\n", o.out.c_str(), ec.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "make-model: writing %s ...\n", o.out.c_str());
  std::vector<TensorView> ordered = tensors->Ordered();
  absl::StatusOr<Fp8Checkpoint> fp8;
  if (config->fp8_checkpoint) {
    fp8 = QuantizeLinearLayers(ordered);
    if (!fp8.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(fp8.status().message()).c_str());
      return 1;
    }
    ordered = fp8->views;
  }
  absl::Status s = WriteCheckpoint(o.out, ordered, static_cast<size_t>(o.shard_mb * (1 << 20)));
  if (s.ok()) {
    s = WriteFileAtomically((std::filesystem::path(o.out) / "config.json").string(), config->ToJson());
  }
  if (s.ok()) s = WriteByteTokenizerFiles(o.out);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %s, %.1fM parameters in %.1f s\n", o.out.c_str(), shape.c_str(),
              o.dtype.c_str(), config->TotalParams() / 1e6, sw.Seconds());
  return 0;
}

}  // namespace

void AddMakeModelCommand(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<MakeModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-model", "Write a Hugging Face checkpoint directory (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2 or -V3, GLM-4.5) with deterministic random weights: "
                    "config.json, safetensors, generation_config.json, and a byte-level tokenizer.json "
                    "and tokenizer_config.json (with a ChatML chat template) that transformers also loads");
  CLI::Option* preset =
      cmd->add_option("--preset", opts->preset,
                      "tiny (unit tests), small (~100M, 8 experts top-2) or medium (~0.8B, 16 experts top-2)")
          ->capture_default_str();
  CLI::Option* family = cmd->add_option("--family", opts->family,
                  "Architecture of the checkpoint: mixtral (MixtralForCausalLM), qwen2_moe (q/k/v biases and a "
                  "gated shared expert), qwen3_moe (per-head q/k norms), olmoe (whole-projection q/k norms), "
                  "deepseek_v3 (multi-head latent attention with query compression, a dense first layer, grouped "
                  "sigmoid routing with a correction bias) or deepseek_v2 (latent attention without query "
                  "compression, greedy softmax routing) or glm4_moe (GLM-4.5: biases, q/k norms, half-head RoPE, "
                  "DeepSeek-V3's MoE), with the preset's shape")
      ->capture_default_str();
  cmd->add_option("--config", opts->config,
                  "A Hugging Face config.json (a family above) whose shape and architecture the checkpoint takes "
                  "instead of a preset's, e.g. benchmarks/configs/mixtral-827m-e16k2.json, so that another engine "
                  "can load the same weights (in --dtype, whatever the file's torch_dtype); excludes --preset and --family")
      ->excludes(preset)
      ->excludes(family);
  cmd->add_option("--seed", opts->seed, "Seed of the weights: the same seed gives the same bytes")
      ->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "Weight dtype: f32 or bf16")->capture_default_str();
  cmd->add_option("--quantization", opts->quantization,
                  "none, or fp8: the linear layers written as float8_e4m3fn with 128 x 128 block scales "
                  "(weight_scale_inv) and an fp8 quantization_config, as DeepSeek-V3 ships; the embedding, "
                  "lm_head and router stay in --dtype")
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "Output directory (created if missing)")->required();
  cmd->add_option("--shard-mb", opts->shard_mb,
                  "Split into shards of at most this many MiB with model.safetensors.index.json "
                  "(0: one file)")
      ->capture_default_str();
  cmd->callback([opts, exit_code] { *exit_code = RunMakeModel(*opts); });
}

}  // namespace moeserve::tools
