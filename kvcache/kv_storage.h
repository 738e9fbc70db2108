// The paged KV cache's memory on one device: layout.num_blocks blocks of BlockBytes() each.
#pragma once

#include "kernels/backend.h"

namespace moeserve {

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
