// A sequence as the scheduler sees it: tokens, how many have KV in the cache, its blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/priority.h"
#include "kvcache/block_hash.h"

namespace moeserve {

struct Sequence {
  enum class State { kWaiting, kRunning, kFinished };

  uint64_t id = 0;
  Priority priority = Priority::kNormal;
  int32_t rank = 0;                 // vLLM's integer priority, within the lane: lower is earlier
  uint64_t arrival = 0;             // submission order: FCFS within a class
  std::vector<int32_t> tokens;      // prompt, then generated tokens
  int64_t prompt_len = 0;
  int64_t max_total_tokens = 0;     // prompt_len + max_tokens, capped by the context
  int64_t num_computed = 0;         // leading tokens whose KV is in the cache
  std::vector<int32_t> blocks;      // block table
  std::vector<BlockHash> hashes;    // of the full blocks of `tokens`
  BlockHash cache_root;             // the prefix cache's namespace (tenant, salt): hashes[0]'s parent
  int64_t registered_blocks = 0;    // leading blocks already indexed in the prefix cache
  int64_t cached_prompt_tokens = 0;  // prefix-cache hit at first admission (all tiers)
  int64_t cached_prompt_tokens_ddr = 0, cached_prompt_tokens_flash = 0;  // ... brought back from them
  int64_t promoted_ddr_blocks = 0, promoted_flash_blocks = 0;            // by the last prefix lookup
  int64_t segment = 0;              // KV pool segment (= expert-parallel rank) holding its blocks
  int64_t preemptions = 0;
  int64_t swaps = 0;                // preemptions that swapped the KV out to DDR
  int64_t swapped_blocks = 0;       // blocks of KV swapped out to DDR (0: not swapped)
  std::vector<int64_t> swap_slots;  // the DDR slots holding them, once the copies ran
  double retain_until = 0;          // keep the prompt's KV cached until then (wall seconds; 0: no)
  bool admitted_before = false;
  bool counted_new = false;         // counted against max_waiting (waiting, and never admitted)
  bool skip_lower_tiers = false;    // its last transfers failed: its next prefix lookup stays on the device
  bool prompt_logits = false;       // every prompt position's logits are wanted (prompt logprobs):
                                    // the prompt is computed, never taken from the prefix cache
  State state = State::kWaiting;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  bool swapped() const { return swapped_blocks > 0; }
  bool in_prefill() const { return num_computed < num_tokens() - 1; }
};

}  // namespace moeserve
