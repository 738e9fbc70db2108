// Content hashes of full KV blocks: a chain over (parent hash, the block's token ids), seeded
// by the model fingerprint, so equal prefixes of the same model map to equal hashes and a
// block's hash commits to everything before it. XXH3-128.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace moeserve {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull)); }
};

// Hash of one block given its parent's hash (zero for the first block).
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t fingerprint);

// Extends `hashes` to cover every full block of `tokens` (block_size tokens each).
void ExtendBlockHashes(std::span<const int32_t> tokens, int64_t block_size, uint64_t fingerprint,
                       std::vector<BlockHash>* hashes);

}  // namespace moeserve
