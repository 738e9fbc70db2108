// Engine and backend flags shared by the commands that run the engine.
#include "absl/strings/str_cat.h"
#include "tools/commands.h"

namespace moeserve::tools {

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "Most sequences in one engine step")->capture_default_str();
  cmd->add_option("--max-tokens-per-step", f->max_tokens_per_step,
                  "Token budget of one step (prefill chunks plus decodes)")
      ->capture_default_str();
  cmd->add_flag("--no-chunked-prefill", f->no_chunked_prefill,
                "Prefill each prompt in one step instead of chunks under the budget");
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "Do not share KV blocks between equal prefixes");
  cmd->add_option("--max-waiting", f->max_waiting, "Waiting-queue bound; beyond it requests are refused")
      ->capture_default_str();
  cmd->add_option("--fast-lane-max-batch", f->fast_lane_max_batch,
                  "Batch size cap while a fast-lane request is in the batch")
      ->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--kv-blocks", f->kv_blocks, "KV blocks on the device (0: from --kv-cache-mb)")->capture_default_str();
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV cache size in MiB when --kv-blocks is 0")->capture_default_str();
  cmd->add_option("--kv-dtype", f->kv_dtype, "KV cache dtype: f32 or bf16")->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (0: one per hardware thread)")->capture_default_str();
  cmd->add_flag("--reference", f->reference, "Use the CPU reference path (slow, the test oracle)");
  cmd->add_flag("--no-batch-invariant", f->no_batch_invariant,
                "Use OpenBLAS for large batches: faster prefill, but outputs may depend on batch mates "
                "in the last bits");
}

absl::StatusOr<EngineConfig> MakeEngineConfig(const EngineFlags& f) {
  EngineConfig c;
  c.scheduler.max_num_seqs = f.max_num_seqs;
  c.scheduler.max_tokens_per_step = f.max_tokens_per_step;
  c.scheduler.chunked_prefill = !f.no_chunked_prefill;
  c.scheduler.prefix_caching = !f.no_prefix_caching;
  c.scheduler.max_waiting = f.max_waiting;
  c.scheduler.fast_lane_max_batch = f.fast_lane_max_batch;
  c.block_size = f.block_size;
  c.num_kv_blocks = f.kv_blocks;
  if (!(f.kv_cache_mb > 0)) return absl::InvalidArgumentError(absl::StrCat("--kv-cache-mb must be > 0, got ", f.kv_cache_mb));
  c.kv_cache_bytes = static_cast<size_t>(f.kv_cache_mb * 1048576.0);
  auto dt = DTypeFromShortName(f.kv_dtype);
  if (!dt.ok() || *dt == DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-dtype must be f32 or bf16, got \"", f.kv_dtype, "\""));
  }
  c.kv_dtype = *dt;
  absl::Status s = c.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("engine flags: ", s.message()));
  return c;
}

CpuBackendOptions MakeBackendOptions(const EngineFlags& f) {
  CpuBackendOptions o;
  o.path = f.reference ? CpuPath::kReference : CpuPath::kFast;
  o.num_threads = f.threads;
  o.batch_invariant = !f.no_batch_invariant;
  return o;
}

}  // namespace moeserve::tools
