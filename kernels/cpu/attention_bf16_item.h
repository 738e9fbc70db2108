// One work item of the bf16 variants' paged attention over a bf16 cache (attention.cc plans the
// items), its context in chunks (attention_chunks.h); the inner loops are attention_bf16.h's.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_item.h"

namespace moeserve::cpu_fast {

struct Bf16Scratch {
  std::vector<float> q, scores, parts;
  std::vector<uint16_t> qb, zeros;
  std::vector<uint32_t> pb;  // the probabilities as bf16 pairs, rows of scores' length / 2
  std::vector<int64_t> keys;  // value keys per row of a pass
};

// The item's queries rounded to bf16 (to nearest even) into qb, rows (g - g0) * nrows + r
// (gathered into `gathered` first): what the bf16 and amx kernels multiply.
void GatherBf16Queries(const ItemRows& it, const float* q, std::vector<float>* gathered, std::vector<uint16_t>* qb);

// The item's queries rounded to bf16 (s->qb), rows (g - g0) * nrows + r.
void PrepareBf16Queries(const ItemRows& it, const float* q, Bf16Scratch* s);

// Keys [it.k_begin, it.ctx_max) (one chunk, on PrepareBf16Queries' queries) into `part`
// (ChunkPartFloats): scores 32 keys a call for all rows of the item's kv heads (their parts of
// each key's row read together), the softmax in fp32 on 16 lanes writing the probabilities
// rounded to bf16, the weighted sum over up to 64 keys a call, up to four heads a block.
void AttendChunkBf16(const ItemRows& it, float scale, Bf16Scratch* s, float* part);

// A whole item (it.k_begin 0): its queries, then each chunk of its context in turn, folded into
// the rows' results as it comes (AttendFolded).
void AttendBf16(const ItemRows& it, const float* q, float scale, float* out, Bf16Scratch* s);

}  // namespace moeserve::cpu_fast
