// BlockPool bookkeeping.
#include "kvcache/block_pool.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

BlockPool::BlockPool(int64_t num_blocks)
    : ref_counts_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      in_list_(num_blocks, 0),
      hash_of_(num_blocks) {
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
      b = PopFront(cached_);  // evict the least recently released cached block
      --num_cached_;
      ++evictions_;
      if (on_evict_) on_evict_(b, *hash_of_[b]);
      index_.erase(*hash_of_[b]);
      hash_of_[b].reset();
    }
    in_list_[b] = 0;
    ref_counts_[b] = 1;
  }
  return out;
}

void BlockPool::Retain(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks());
  if (ref_counts_[block] == 0) {
    MS_CHECK(in_list_[block] == 2);  // only cached blocks can be taken back
    Unlink(cached_, block);
    in_list_[block] = 0;
    --num_cached_;
  }
  ++ref_counts_[block];
}

void BlockPool::Release(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  if (--ref_counts_[block] > 0) return;
  if (hash_of_[block].has_value()) {
    PushBack(cached_, block);
    in_list_[block] = 2;
    ++num_cached_;
  } else {
    PushBack(free_, block);
    in_list_[block] = 1;
    ++num_free_;
  }
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
  int64_t free = 0, cached = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const bool has_hash = hash_of_[b].has_value();
    if (ref_counts_[b] < 0) return false;
    if (ref_counts_[b] > 0 && in_list_[b] != 0) return false;
    if (ref_counts_[b] == 0 && in_list_[b] == 0) return false;
    if (in_list_[b] == 1 && has_hash) return false;
    if (in_list_[b] == 2 && !has_hash) return false;
    if (has_hash) {
      auto it = index_.find(*hash_of_[b]);
      if (it == index_.end() || it->second != b) return false;
    }
    free += in_list_[b] == 1;
    cached += in_list_[b] == 2;
  }
  // Walk both lists to check their links.
  int64_t walked = 0;
  for (int32_t b = free_.head; b >= 0; b = next_[b]) walked += in_list_[b] == 1 ? 1 : 1000000;
  for (int32_t b = cached_.head; b >= 0; b = next_[b]) walked += in_list_[b] == 2 ? 1 : 1000000;
  return free == num_free_ && cached == num_cached_ && walked == free + cached &&
         static_cast<int64_t>(index_.size()) >= cached;
}

}  // namespace moeserve
