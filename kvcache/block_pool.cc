// BlockPool bookkeeping.
#include "kvcache/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

BlockPool::BlockPool(int64_t num_blocks, int64_t segments)
    : ref_counts_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      in_list_(num_blocks, 0),
      hash_of_(num_blocks),
      retain_until_(num_blocks, 0.0),
      segs_(std::max<int64_t>(1, std::min(segments, num_blocks))),
      seg_size_(std::max<int64_t>(1, num_blocks / static_cast<int64_t>(segs_.size()))) {
  for (int32_t b = 0; b < num_blocks; ++b) {
    Segment& sg = segs_[segment_of(b)];
    PushBack(sg.free, b);
    ++sg.free_count;
    in_list_[b] = 1;
  }
  num_free_ = num_blocks;
}

BlockHash BlockPool::KeyOf(const BlockHash& hash, int64_t segment) {
  if (segment == 0) return hash;
  return BlockHash{hash.lo ^ (static_cast<uint64_t>(segment) * 0x9e3779b97f4a7c15ull),
                   hash.hi + static_cast<uint64_t>(segment)};
}

void BlockPool::PushBack(List& l, int32_t b) {
  prev_[b] = l.tail;
  next_[b] = -1;
  if (l.tail >= 0) next_[l.tail] = b;
  l.tail = b;
  if (l.head < 0) l.head = b;
}

void BlockPool::Unlink(List& l, int32_t b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b]; else l.head = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b]; else l.tail = prev_[b];
  prev_[b] = next_[b] = -1;
}

int32_t BlockPool::PopFront(List& l) {
  const int32_t b = l.head;
  Unlink(l, b);
  return b;
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n, int64_t segment,
                                                          std::vector<BlockEviction>* evicted) {
  MS_CHECK(segment >= 0 && segment < num_segments());
  Segment& sg = segs_[segment];
  if (n > num_available(segment)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: need ", n, " blocks, ", num_available(segment), " of ",
                                                     segment_blocks(segment), " available",
                                                     num_segments() > 1 ? absl::StrCat(" in segment ", segment) : ""));
  }
  std::vector<int32_t> out(n);
  for (auto& b : out) {
    if (sg.free_count > 0) {
      b = PopFront(sg.free);
      --sg.free_count;
      --num_free_;
    } else {
      // Evict the least recently released cached block; a retained one only when no ordinary
      // cached block is left (the sequences running now must not starve).
      if (sg.cached.head >= 0) {
        b = PopFront(sg.cached);
      } else {
        b = PopFront(sg.retained);
        --sg.retained_count;
        --num_retained_;
      }
      --sg.cached_count;
      --num_cached_;
      ++evictions_;
      if (evicted != nullptr) evicted->push_back(BlockEviction{b, *hash_of_[b], retain_until_[b]});
      index_.erase(KeyOf(*hash_of_[b], segment));
      hash_of_[b].reset();
    }
    in_list_[b] = 0;
    ref_counts_[b] = 1;
    retain_until_[b] = 0.0;
  }
  return out;
}

void BlockPool::Retain(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks());
  if (ref_counts_[block] == 0) {
    MS_CHECK(in_list_[block] == 2 || in_list_[block] == 3);  // only cached blocks can be taken back
    Uncache(block);
  }
  ++ref_counts_[block];
}

void BlockPool::Uncache(int32_t b) {
  Segment& sg = segs_[segment_of(b)];
  if (in_list_[b] == 3) {
    Unlink(sg.retained, b);
    --sg.retained_count;
    --num_retained_;
  } else {
    Unlink(sg.cached, b);
  }
  in_list_[b] = 0;
  --sg.cached_count;
  --num_cached_;
}

void BlockPool::PushFree(int32_t b) {
  Segment& sg = segs_[segment_of(b)];
  PushBack(sg.free, b);
  in_list_[b] = 1;
  ++sg.free_count;
  ++num_free_;
}

void BlockPool::Release(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  if (--ref_counts_[block] > 0) return;
  if (hash_of_[block].has_value()) {
    Park(block);
  } else {
    PushFree(block);
  }
}

void BlockPool::Park(int32_t b) {
  Segment& sg = segs_[segment_of(b)];
  ++sg.cached_count;
  ++num_cached_;
  if (retain_until_[b] > now_) {
    PushBack(sg.retained, b);
    in_list_[b] = 3;
    ++sg.retained_count;
    ++num_retained_;
    next_expiry_ = num_retained_ == 1 ? retain_until_[b] : std::min(next_expiry_, retain_until_[b]);
  } else {
    PushBack(sg.cached, b);
    in_list_[b] = 2;
  }
}

void BlockPool::SetRetention(int32_t block, double until) {
  MS_CHECK(block >= 0 && block < num_blocks());
  // Only indexed blocks can be found again; a later deadline wins.
  if (!hash_of_[block].has_value() || until <= retain_until_[block]) return;
  retain_until_[block] = until;
  if (in_list_[block] == 2 && until > now_) {
    Segment& sg = segs_[segment_of(block)];
    Unlink(sg.cached, block);
    --sg.cached_count;
    --num_cached_;
    Park(block);
  }
}

void BlockPool::AdvanceClock(double now) {
  now_ = now;
  if (num_retained_ == 0 || now < next_expiry_) return;
  // Expired blocks go to the front of the LRU: the first ordinary candidates for eviction.
  double next = 0;
  for (Segment& sg : segs_) {
    for (int32_t b = sg.retained.tail; b >= 0;) {
      const int32_t prev = prev_[b];
      if (retain_until_[b] <= now) {
        Unlink(sg.retained, b);
        --sg.retained_count;
        --num_retained_;
        prev_[b] = -1;
        next_[b] = sg.cached.head;
        if (sg.cached.head >= 0) prev_[sg.cached.head] = b; else sg.cached.tail = b;
        sg.cached.head = b;
        in_list_[b] = 2;
      } else {
        next = next == 0 ? retain_until_[b] : std::min(next, retain_until_[b]);
      }
      b = prev;
    }
  }
  next_expiry_ = next;
}

void BlockPool::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) Release(b);
}

void BlockPool::Register(int32_t block, const BlockHash& hash) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  const BlockHash key = KeyOf(hash, segment_of(block));
  if (hash_of_[block].has_value() || index_.count(key)) return;
  hash_of_[block] = hash;
  index_[key] = block;
}

void BlockPool::Forget(int32_t block, const BlockHash& hash) {
  MS_CHECK(block >= 0 && block < num_blocks());
  if (hash_of_[block] != hash) return;
  if (in_list_[block] >= 2) {  // cached: it becomes free
    Uncache(block);
    PushFree(block);
  }
  index_.erase(KeyOf(hash, segment_of(block)));
  hash_of_[block].reset();
  retain_until_[block] = 0.0;
}

std::optional<int32_t> BlockPool::Lookup(const BlockHash& hash, int64_t segment) const {
  auto it = index_.find(KeyOf(hash, segment));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::CheckInvariants() const {
  int64_t free = 0, cached = 0, retained = 0;
  std::vector<int64_t> seg_free(segs_.size(), 0), seg_cached(segs_.size(), 0), seg_retained(segs_.size(), 0);
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const bool has_hash = hash_of_[b].has_value();
    if (ref_counts_[b] < 0) return false;
    if (ref_counts_[b] > 0 && in_list_[b] != 0) return false;
    if (ref_counts_[b] == 0 && in_list_[b] == 0) return false;
    if (in_list_[b] == 1 && has_hash) return false;
    if (in_list_[b] >= 2 && !has_hash) return false;
    if (in_list_[b] == 3 && retain_until_[b] <= 0) return false;
    if (has_hash) {
      auto it = index_.find(KeyOf(*hash_of_[b], segment_of(b)));
      if (it == index_.end() || it->second != b) return false;
    }
    const int64_t s = segment_of(b);
    free += in_list_[b] == 1;
    cached += in_list_[b] >= 2;
    retained += in_list_[b] == 3;
    seg_free[s] += in_list_[b] == 1;
    seg_cached[s] += in_list_[b] >= 2;
    seg_retained[s] += in_list_[b] == 3;
  }
  int64_t walked = 0;
  for (size_t s = 0; s < segs_.size(); ++s) {
    const Segment& sg = segs_[s];
    if (sg.free_count != seg_free[s] || sg.cached_count != seg_cached[s] || sg.retained_count != seg_retained[s]) {
      return false;
    }
    const std::pair<const List*, uint8_t> lists[] = {{&sg.free, 1}, {&sg.cached, 2}, {&sg.retained, 3}};
    for (auto [l, state] : lists) {
      int32_t prev = -1;
      for (int32_t b = l->head; b >= 0; b = next_[b]) {
        // Every block on a list is in that state, in this segment, with back links that agree.
        if (in_list_[b] != state || segment_of(b) != static_cast<int64_t>(s) || prev_[b] != prev) return false;
        prev = b;
        ++walked;
      }
      if (l->tail != prev) return false;
    }
  }
  return free == num_free_ && cached == num_cached_ && retained == num_retained_ && walked == free + cached &&
         static_cast<int64_t>(index_.size()) >= cached;
}

}  // namespace moeserve
