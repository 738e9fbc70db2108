// Block hash chain on XXH3-128.
#include "kvcache/block_hash.h"

#include <xxhash.h>

#include <cstring>

namespace moeserve {

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t fingerprint) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset_withSeed(state, fingerprint);
  XXH3_128bits_update(state, &parent, sizeof(parent));
  XXH3_128bits_update(state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return BlockHash{h.low64, h.high64};
}

BlockHash CacheRoot(std::string_view tenant, std::string_view salt) {
  if (tenant.empty() && salt.empty()) return BlockHash{};
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
  for (std::string_view part : {std::string_view("moeserve cache namespace"), tenant, salt}) {
    const uint64_t n = part.size();
    XXH3_128bits_update(state, &n, sizeof(n));
    XXH3_128bits_update(state, part.data(), part.size());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return BlockHash{h.low64, h.high64 | 1};  // never the shared root
}

void ExtendBlockHashes(std::span<const int32_t> tokens, int64_t block_size, uint64_t fingerprint,
                       const BlockHash& root, std::vector<BlockHash>* hashes) {
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  for (int64_t b = static_cast<int64_t>(hashes->size()); b < full; ++b) {
    const BlockHash parent = b == 0 ? root : (*hashes)[b - 1];
    hashes->push_back(HashBlock(parent, tokens.subspan(b * block_size, block_size), fingerprint));
  }
}

}  // namespace moeserve
