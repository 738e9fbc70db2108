// Admission that lets a prompt wait for its twin: a waiting sequence whose prompt is mostly the
// prompt a running sequence is still prefilling (n choices of one request, a burst of
// requests with one long system prompt) is held back until those blocks are computed and
// registered, then takes them from the prefix cache instead of computing them a second time
// in the same steps.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sequence.h"

namespace moeserve {

// The running sequence `seq` should wait for, or null: one in the same cache namespace (equal
// first block hash) and on the same pool segment (EP rank) still computing prompt blocks that
// `seq` shares, when the shared full
// blocks are at least half of `seq`'s prompt and some of them are not registered yet.
const Sequence* SharedPrefixTwin(const Sequence& seq, const std::vector<Sequence*>& running, int64_t block_size);

}  // namespace moeserve
