// KvStorage allocation.
#include "kvcache/kv_storage.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

absl::StatusOr<KvStorage> KvStorage::Create(Backend* backend, const KvLayout& layout) {
  if (layout.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks must be >= 1, got ", layout.num_blocks));
  }
  if (layout.block_size < 1 || layout.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: block_size must be in [1, 1024], got ", layout.block_size));
  }
  if (layout.dtype != DType::kF32 && layout.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("KV cache: dtype must be f32 or bf16");
  }
  KvStorage s;
  s.layout_ = layout;
  ASSIGN_OR_RETURN(s.buffer_, backend->Allocate(layout.BlockBytes() * layout.num_blocks));
  return s;
}

}  // namespace moeserve
