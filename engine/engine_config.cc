// The engine's configuration checks, its model fingerprint, and the names of finish reasons.
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/engine.h"

namespace moeserve {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline_exceeded";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

absl::Status EngineConfig::Validate() const {
  RETURN_IF_ERROR(scheduler.Validate());
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be in [1, 1024], got ", block_size));
  }
  if (num_kv_blocks < 0) return absl::InvalidArgumentError("num_kv_blocks must be >= 0");
  if (kv_dtype != DType::kF32 && kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("kv_dtype must be f32 or bf16");
  }
  RETURN_IF_ERROR(limits.Validate());
  if (parallel.ep < 1 || parallel.pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep and --pp must be >= 1, got ", parallel.ep, " and ", parallel.pp));
  }
  return absl::OkStatus();
}

uint64_t ModelFingerprint(const ModelWeights& weights, const Backend& backend, DType kv_dtype,
                          int64_t block_size) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const std::string cfg = weights.config().ToJson();
  XXH3_64bits_update(st, cfg.data(), cfg.size());
  const std::string numerics = backend.KernelNumerics();
  XXH3_64bits_update(st, numerics.data(), numerics.size() + 1);
  // Every weight byte with its name, shape and dtype (hashed while loading), and what a KV
  // block's bytes mean: a block written by any other model or layout never matches.
  const uint64_t parts[] = {weights.content_digest(), static_cast<uint64_t>(weights.dtype()),
                            static_cast<uint64_t>(kv_dtype), static_cast<uint64_t>(block_size),
                            KvLayout::kFormatVersion};
  XXH3_64bits_update(st, parts, sizeof(parts));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace moeserve
