// BlockPool bookkeeping.
#include "kvcache/block_pool.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

BlockPool::BlockPool(int64_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  if (n > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: need ", n, " blocks, ", num_free(), " of ", num_blocks(), " free"));
  }
  std::vector<int32_t> out(n);
  for (auto& b : out) {
    b = free_.back();
    free_.pop_back();
    ref_counts_[b] = 1;
  }
  return out;
}

void BlockPool::Retain(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockPool::Release(int32_t block) {
  MS_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0);
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

void BlockPool::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) Release(b);
}

bool BlockPool::CheckInvariants() const {
  std::vector<int> seen(ref_counts_.size(), 0);
  for (int32_t b : free_) {
    if (b < 0 || b >= num_blocks() || ref_counts_[b] != 0 || seen[b]++) return false;
  }
  int64_t zero = 0;
  for (int32_t c : ref_counts_) {
    if (c < 0) return false;
    zero += c == 0;
  }
  return zero == num_free();
}

}  // namespace moeserve
