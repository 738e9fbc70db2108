// BlockPool bookkeeping.
#include "kvcache/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

BlockPool::BlockPool(int64_t num_blocks)
    : ref_counts_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      in_list_(num_blocks, 0),
      hash_of_(num_blocks),
      retain_until_(num_blocks, 0.0) {
  for (int32_t b = 0; b < num_blocks; ++b) {
    PushBack(free_, b);
    in_list_[b] = 1;
  }
  num_free_ = num_blocks;
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

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  if (n > num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: need ", n, " blocks, ", num_available(),
                                                     " of ", num_blocks(), " available"));
  }
  std::vector<int32_t> out(n);
  for (auto& b : out) {
    if (num_free_ > 0) {
      b = PopFront(free_);
      --num_free_;
    } else {
      // Evict the least recently released cached block; a retained one only when no ordinary
      // cached block is left (the sequences running now must not starve).
      if (cached_.head >= 0) {
        b = PopFront(cached_);
      } else {
        b = PopFront(retained_);
        --num_retained_;
      }
      --num_cached_;
      ++evictions_;
      if (on_evict_) on_evict_(b, *hash_of_[b]);
      index_.erase(*hash_of_[b]);
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
    if (in_list_[block] == 3) {
      Unlink(retained_, block);
      --num_retained_;
    } else {
      Unlink(cached_, block);
    }
    in_list_[block] = 0;
    --num_cached_;
  }
  ++ref_counts_[block];
}

void BlockPool::Release(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  if (--ref_counts_[block] > 0) return;
  if (hash_of_[block].has_value()) {
    Park(block);
  } else {
    PushBack(free_, block);
    in_list_[block] = 1;
    ++num_free_;
  }
}

void BlockPool::Park(int32_t b) {
  ++num_cached_;
  if (retain_until_[b] > now_) {
    PushBack(retained_, b);
    in_list_[b] = 3;
    ++num_retained_;
    next_expiry_ = num_retained_ == 1 ? retain_until_[b] : std::min(next_expiry_, retain_until_[b]);
  } else {
    PushBack(cached_, b);
    in_list_[b] = 2;
  }
}

void BlockPool::SetRetention(int32_t block, double until) {
  MS_CHECK(block >= 0 && block < num_blocks());
  // Only indexed blocks can be found again; a later deadline wins.
  if (!hash_of_[block].has_value() || until <= retain_until_[block]) return;
  retain_until_[block] = until;
  if (in_list_[block] == 2 && until > now_) {
    Unlink(cached_, block);
    --num_cached_;
    Park(block);
  }
}

void BlockPool::AdvanceClock(double now) {
  now_ = now;
  if (num_retained_ == 0 || now < next_expiry_) return;
  // Expired blocks go to the front of the LRU: the first ordinary candidates for eviction.
  double next = 0;
  for (int32_t b = retained_.tail; b >= 0;) {
    const int32_t prev = prev_[b];
    if (retain_until_[b] <= now) {
      Unlink(retained_, b);
      --num_retained_;
      prev_[b] = -1;
      next_[b] = cached_.head;
      if (cached_.head >= 0) prev_[cached_.head] = b; else cached_.tail = b;
      cached_.head = b;
      in_list_[b] = 2;
    } else {
      next = next == 0 ? retain_until_[b] : std::min(next, retain_until_[b]);
    }
    b = prev;
  }
  next_expiry_ = next;
}

void BlockPool::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) Release(b);
}

void BlockPool::Register(int32_t block, const BlockHash& hash) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  if (hash_of_[block].has_value() || index_.count(hash)) return;
  hash_of_[block] = hash;
  index_[hash] = block;
}

std::optional<int32_t> BlockPool::Lookup(const BlockHash& hash) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::CheckInvariants() const {
  int64_t free = 0, cached = 0, retained = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const bool has_hash = hash_of_[b].has_value();
    if (ref_counts_[b] < 0) return false;
    if (ref_counts_[b] > 0 && in_list_[b] != 0) return false;
    if (ref_counts_[b] == 0 && in_list_[b] == 0) return false;
    if (in_list_[b] == 1 && has_hash) return false;
    if (in_list_[b] >= 2 && !has_hash) return false;
    if (in_list_[b] == 3 && retain_until_[b] <= 0) return false;
    if (has_hash) {
      auto it = index_.find(*hash_of_[b]);
      if (it == index_.end() || it->second != b) return false;
    }
    free += in_list_[b] == 1;
    cached += in_list_[b] >= 2;
    retained += in_list_[b] == 3;
  }
  // Walk both lists to check their links.
  int64_t walked = 0;
  for (const List* l : {&free_, &cached_, &retained_}) {  // back links agree with forward links
    int32_t prev = -1;
    for (int32_t b = l->head; b >= 0; b = next_[b]) {
      if (prev_[b] != prev) return false;
      prev = b;
    }
    if (l->tail != prev) return false;
  }
  for (int32_t b = free_.head; b >= 0; b = next_[b]) walked += in_list_[b] == 1 ? 1 : 1000000;
  for (int32_t b = cached_.head; b >= 0; b = next_[b]) walked += in_list_[b] == 2 ? 1 : 1000000;
  for (int32_t b = retained_.head; b >= 0; b = next_[b]) walked += in_list_[b] == 3 ? 1 : 1000000;
  return free == num_free_ && cached == num_cached_ && retained == num_retained_ && walked == free + cached &&
         static_cast<int64_t>(index_.size()) >= cached;
}

}  // namespace moeserve
