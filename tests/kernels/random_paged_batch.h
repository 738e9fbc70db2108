// What the paged attention tests (paged_attention_test.cc, paged_attention_bf16_test.cc) share:
// random batches over scattered block tables of a fresh cache, and the check that every token of
// a batch equals itself computed alone.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "tests/test_util.h"

namespace moeserve::testing {

// A cache layout of `layers` layers, `block` tokens a block, `kvh` kv heads of `hd`.
inline KvLayout Layout(int64_t layers, int64_t block, int64_t kvh, int64_t hd, DType dtype) {
  KvLayout layout;
  layout.num_layers = layers;
  layout.block_size = block;
  layout.kv_heads = kvh;
  layout.head_dim = hd;
  layout.dtype = dtype;
  return layout;
}

// Sequences of random lengths in scattered blocks of a fresh cache (random K and V, written by
// `writer`), a decode token for each and a prefill chunk of up to `chunk` tokens for every
// `every`-th, and random queries; keys and queries drawn `spread` times wider than values.
// `lens`, if given, fixes the sequences' lengths (one each).
struct RandomBatch {
  KvLayout layout;
  int64_t layer = 0, q_heads = 0, seqs = 0, max_blocks = 0;
  std::vector<int32_t> tables, token_seq, token_pos;
  std::vector<uint8_t> cache;
  std::vector<float> q;
  int64_t tokens() const { return static_cast<int64_t>(token_seq.size()); }
  AttentionBatch Batch() const { return {token_seq.data(), token_pos.data(), tables.data(), tokens(), seqs, max_blocks}; }
  // Token i alone, as a batch of one.
  AttentionBatch One(int64_t i) const { return {&token_seq[i], &token_pos[i], tables.data(), 1, seqs, max_blocks}; }
};

inline RandomBatch MakeRandomBatch(Backend& writer, const KvLayout& layout, int64_t layer, int64_t q_heads, int64_t seqs,
                            int64_t max_blocks, int64_t every, int64_t chunk, float spread, std::mt19937& gen,
                            const std::vector<int64_t>& lens_given = {}) {
  if (!lens_given.empty()) {
    EXPECT_EQ(static_cast<int64_t>(lens_given.size()), seqs) << "one length a sequence";
  }
  RandomBatch rb;
  rb.layout = layout;
  rb.layer = layer;
  rb.q_heads = q_heads;
  rb.seqs = seqs;
  rb.max_blocks = max_blocks;
  const int64_t bs = layout.block_size, te = layout.TokenElems();
  std::vector<int64_t> lens = lens_given;
  if (lens.empty()) {
    lens.resize(static_cast<size_t>(seqs));
    for (auto& l : lens) l = std::uniform_int_distribution<int64_t>(1, max_blocks * bs)(gen);
  }
  int64_t blocks = 0;
  for (int64_t l : lens) blocks += (l + bs - 1) / bs;
  rb.layout.num_blocks = blocks;
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  rb.tables.assign(static_cast<size_t>(seqs * max_blocks), 0);
  rb.cache.assign(static_cast<size_t>(blocks) * rb.layout.BlockBytes(), 0);
  size_t next = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    std::vector<int64_t> slots(static_cast<size_t>(lens[s]));
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) rb.tables[s * max_blocks + b] = order[next++];
    for (int64_t p = 0; p < lens[s]; ++p) slots[p] = rb.tables[s * max_blocks + p / bs] * bs + p % bs;
    const auto k = RandomFloats(lens[s] * te, gen(), spread), v = RandomFloats(lens[s] * te, gen());
    writer.WriteKv(k.data(), v.data(), slots.data(), lens[s], rb.layout, layer, rb.cache.data());
    const int64_t n = s % every == 0 ? std::min(lens[s], chunk) : 1;
    for (int64_t p = lens[s] - n; p < lens[s]; ++p) {
      rb.token_seq.push_back(static_cast<int32_t>(s));
      rb.token_pos.push_back(static_cast<int32_t>(p));
    }
  }
  rb.q = RandomFloats(rb.tokens() * q_heads * layout.head_dim, gen(), spread);
  return rb;
}

// Every token of `out` (the whole batch on `b`) is bit-equal to itself computed alone. On the
// amx kernel a token alone is an item of `group` rows, whose keys are read from the cache as A
// tiles, while the batch's prefill tiles (more than 16 rows) score against packed keys as B
// tiles: this also checks that the two operand orders give the same bits on this hardware.
// `b` has Backend::PagedAttention's signature.
template <typename Attention>
void ExpectEachTokenAsAlone(Attention& b, const RandomBatch& rb, float scale, const std::vector<float>& out) {
  const int64_t row = rb.q_heads * rb.layout.head_dim;
  for (int64_t i = 0; i < rb.tokens(); ++i) {
    std::vector<float> alone(static_cast<size_t>(row));
    b.PagedAttention(rb.q.data() + i * row, rb.One(i), rb.layout, rb.layer, rb.cache.data(), rb.q_heads, scale,
                     alone.data());
    ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + i * row, alone.size() * sizeof(float)))
        << "sequence " << rb.token_seq[i] << " position " << rb.token_pos[i] << ": differs from the same token alone";
  }
}

}  // namespace moeserve::testing
