// Shared-prefix admission (see shared_prefix.h).
#include "engine/shared_prefix.h"

#include <algorithm>

namespace moeserve {

const Sequence* SharedPrefixTwin(const Sequence& seq, const std::vector<Sequence*>& running, int64_t block_size) {
  // Only a fresh prompt of at least one block (hashed at Add) can take blocks from the cache.
  if (seq.hashes.empty() || !seq.blocks.empty() || seq.swapped() || seq.prompt_logits) return nullptr;
  for (const Sequence* r : running) {
    // (Only a twin on the same KV pool segment, the same EP rank, can share its blocks.)
    if (r->hashes.empty() || r->hashes[0] != seq.hashes[0] || r->segment != seq.segment ||
        r->num_computed >= r->prompt_len) {
      continue;
    }
    const int64_t limit = std::min(seq.prompt_len, r->prompt_len);
    const auto mismatch = std::mismatch(seq.tokens.begin(), seq.tokens.begin() + limit, r->tokens.begin());
    // Blocks a cache hit can give: full ones, and never the last prompt token's (it is computed).
    const int64_t common = std::min<int64_t>(mismatch.first - seq.tokens.begin(), seq.prompt_len - 1);
    const int64_t shared = common / block_size;
    if (shared > r->registered_blocks && 2 * shared * block_size >= seq.prompt_len) return r;
  }
  return nullptr;
}

}  // namespace moeserve
