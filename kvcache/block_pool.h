// A pool of fixed-size KV blocks on one tier with a prefix cache: pure bookkeeping, it never
// touches block contents.
//
// Every block is in exactly one state:
//   free     - reference count 0, no content worth keeping;
//   cached   - reference count 0 but holding a full block whose hash is indexed: reusable by a
//              later prefix hit until evicted (least recently released first);
//   retained - cached, but a request asked that it be kept until a deadline: evicted only when
//              no ordinary cached block is left, and an ordinary cached block once expired;
//   in use   - reference count > 0 (shared prefix blocks have counts above one).
// Allocation takes free blocks first, then evicts cached ones.
//
// A pool may be cut into segments of consecutive block ids (one per expert-parallel rank, whose
// device holds those blocks): every list, count and prefix-cache entry is per segment, an
// allocation takes blocks of one segment, and a lookup finds only that segment's blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/block_hash.h"

namespace moeserve {

// A cached block that an allocation evicted, with its contents still intact: a lower tier may
// keep a copy before the block's new owner writes it.
struct BlockEviction {
  int32_t block = 0;
  BlockHash hash;
  double retain_until = 0;  // its retention deadline (0: none)
};

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks, int64_t segments = 1);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_segments() const { return static_cast<int64_t>(segs_.size()); }
  // Segment s holds blocks [segment_begin(s), segment_begin(s + 1)).
  int64_t segment_begin(int64_t s) const { return s * seg_size_; }
  int64_t segment_blocks(int64_t s) const {
    return s + 1 == num_segments() ? num_blocks() - s * seg_size_ : seg_size_;
  }
  int64_t segment_of(int32_t block) const { return std::min<int64_t>(block / seg_size_, num_segments() - 1); }
  // Blocks an allocation can take now: free plus cached (all segments, or one).
  int64_t num_available() const { return num_free_ + num_cached_; }
  int64_t num_available(int64_t segment) const { return segs_[segment].free_count + segs_[segment].cached_count; }
  int64_t num_free() const { return num_free_; }
  int64_t num_cached() const { return num_cached_; }  // retained included
  int64_t num_retained() const { return num_retained_; }
  int64_t num_used() const { return num_blocks() - num_available(); }
  int64_t evictions() const { return evictions_; }

  // Takes `n` blocks of `segment` (reference count 1 each), or none: RESOURCE_EXHAUSTED when
  // fewer than `n` are available there. Cached blocks it evicts are appended to `evicted`.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n, int64_t segment = 0,
                                                std::vector<BlockEviction>* evicted = nullptr);
  // Adds a reference to an in-use or cached block (a prefix hit takes a cached block back).
  void Retain(int32_t block);
  // Drops one reference; at zero the block becomes cached when it has a hash, else free.
  void Release(int32_t block);
  void Release(const std::vector<int32_t>& blocks);

  // Indexes an in-use full block under `hash`, unless that hash already names another block of
  // its segment.
  void Register(int32_t block, const BlockHash& hash);
  // Drops `block`'s index entry if it is still `hash` (its contents turned out not to be that
  // block's): lookups miss it from now on, and a cached block becomes free.
  void Forget(int32_t block, const BlockHash& hash);
  // The block of `segment` holding `hash`, if cached or in use.
  std::optional<int32_t> Lookup(const BlockHash& hash, int64_t segment = 0) const;

  // Retention: keeps `block` (in use or cached, with a hash) in preference to ordinary cached
  // blocks until `until` (seconds on the caller's clock; a later deadline wins).
  void SetRetention(int32_t block, double until);
  double retention(int32_t block) const { return retain_until_[block]; }
  // Advances the pool's clock; retained blocks whose deadline passed become ordinary cached
  // blocks, the oldest candidates for eviction.
  void AdvanceClock(double now);

  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }
  // The hash a block is indexed under, if any.
  const std::optional<BlockHash>& hash_of(int32_t block) const { return hash_of_[block]; }
  // Checks that every block is in exactly one state and the counts agree.
  bool CheckInvariants() const;

 private:
  // Intrusive doubly linked lists over block ids: one for free blocks, one LRU for cached ones.
  struct List {
    int32_t head = -1, tail = -1;
  };
  struct Segment {
    List free, cached, retained;
    int64_t free_count = 0, cached_count = 0, retained_count = 0;  // cached includes retained
  };
  void PushBack(List& l, int32_t b);
  void Unlink(List& l, int32_t b);
  int32_t PopFront(List& l);
  // The prefix-cache key of `hash` in `segment` (the hash itself in segment 0).
  static BlockHash KeyOf(const BlockHash& hash, int64_t segment);

  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> prev_, next_;
  // Puts a block whose count dropped to zero (and that has a hash) on the right list.
  void Park(int32_t b);
  // Takes a cached (or retained) block off its list; it is then in use or about to be freed.
  void Uncache(int32_t b);
  // Puts a block with no hash and no references on its segment's free list.
  void PushFree(int32_t b);

  std::vector<uint8_t> in_list_;  // 0 none, 1 free list, 2 cached list, 3 retained list
  std::vector<std::optional<BlockHash>> hash_of_;
  std::vector<double> retain_until_;  // 0: not retained
  double now_ = 0, next_expiry_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  std::vector<Segment> segs_;
  int64_t seg_size_ = 1;
  int64_t num_free_ = 0, num_cached_ = 0, num_retained_ = 0, evictions_ = 0;
};

}  // namespace moeserve
