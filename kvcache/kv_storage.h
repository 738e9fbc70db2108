// The paged KV cache's memory on one device: layout.num_blocks blocks of BlockBytes() each.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"

namespace moeserve {

// One device-resident piece of a pool block: `bytes` at `data` on `backend`. A block of a single
// device's cache is one piece; with pipeline stages it is one piece per stage (that stage's
// layers), and the pieces in stage order make up the single-device block layout
// ([layers][K, V][tokens][kv heads][head dim]), which is what the host tiers and flash store.
// Under mpirun a piece may be held by another process: no backend, its rank and block instead.
struct KvBlockPart {
  Backend* backend = nullptr;  // null: held by process `remote_rank`
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int remote_rank = -1;        // the process holding it (backend null)
  int32_t remote_block = -1;   // its block in that process's arena
  bool remote() const { return backend == nullptr; }
};
// The pieces of pool block `block`, in layer order.
using KvBlockParts = std::function<void(int32_t block, std::vector<KvBlockPart>* parts)>;

// The pieces other processes hold (the worker ranks of an MPI job, runner/remote_kv.h), as a
// write-back cache for one transfer list: the pieces the list reads are fetched before it runs,
// one message per process; reads and writes then go to the cached copies (so a piece read after
// a write in the same list sees the write); Commit sends the written ones back, one message per
// process, and forgets everything.
class KvRemotePieces {
 public:
  virtual ~KvRemotePieces() = default;
  // Reads the current contents of these remote pieces (those not cached already).
  virtual absl::Status Fetch(const std::vector<KvBlockPart>& pieces) = 0;
  // Copies a cached piece into `out` (piece.bytes); false if it was not fetched.
  virtual bool Read(const KvBlockPart& piece, uint8_t* out) const = 0;
  // Sets a piece's new contents (copied now).
  virtual void Write(const KvBlockPart& piece, const uint8_t* data) = 0;
  // Writes the written pieces into their processes' arenas and waits until they are there.
  virtual absl::Status Commit() = 0;
};

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
