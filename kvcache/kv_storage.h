// The paged KV cache's memory on one device: layout.num_blocks blocks of BlockBytes() each.
#pragma once

#include <functional>
#include <vector>

#include "kernels/backend.h"

namespace moeserve {

// One device-resident piece of a pool block: `bytes` at `data` on `backend`. A block of a single
// device's cache is one piece; with pipeline stages it is one piece per stage (that stage's
// layers), and the pieces in stage order make up the single-device block layout
// ([layers][K, V][tokens][kv heads][head dim]), which is what the host tiers and flash store.
struct KvBlockPart {
  Backend* backend = nullptr;
  uint8_t* data = nullptr;
  size_t bytes = 0;
};
// The pieces of pool block `block`, in layer order.
using KvBlockParts = std::function<void(int32_t block, std::vector<KvBlockPart>* parts)>;

class KvStorage {
 public:
  // Allocates the blocks of `layout` on `backend`.
  static absl::StatusOr<KvStorage> Create(Backend* backend, const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  void* data() const { return buffer_.data(); }
  size_t bytes() const { return buffer_.bytes(); }

 private:
  KvLayout layout_;
  DeviceBuffer buffer_;
};

}  // namespace moeserve
