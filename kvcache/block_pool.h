// A pool of fixed-size KV blocks on one tier: allocation, reference counts and exact
// accounting. Pure bookkeeping: it never touches the block contents.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  // Takes `n` free blocks (reference count 1 each), or none: RESOURCE_EXHAUSTED when fewer
  // than `n` are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Adds a reference to an allocated block (a shared prefix).
  void Retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero.
  void Release(int32_t block);
  void Release(const std::vector<int32_t>& blocks);

  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }
  // Every block is either free with count 0 or allocated with count > 0, exactly once.
  bool CheckInvariants() const;

 private:
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first
};

}  // namespace moeserve
