// Content hashes of full KV blocks: a chain over (parent hash, the block's token ids), seeded
// by the model fingerprint, so equal prefixes of the same model map to equal hashes and a
// block's hash commits to everything before it. XXH3-128. The first block's parent is the
// chain's root: zero, or a cache namespace (tenant and salt), so that prefixes are shared
// only within one namespace, in every tier.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
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

// Hash of one block given its parent's hash (the chain's root for the first block).
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t fingerprint);

// The root of a cache namespace: zero (shared by every request) when both are empty, else a
// hash of the tenant and the salt, so different tenants or salts never share a block.
BlockHash CacheRoot(std::string_view tenant, std::string_view salt);

// Extends `hashes` to cover every full block of `tokens` (block_size tokens each), the first
// block's parent being `root`.
void ExtendBlockHashes(std::span<const int32_t> tokens, int64_t block_size, uint64_t fingerprint,
                       const BlockHash& root, std::vector<BlockHash>* hashes);

}  // namespace moeserve
