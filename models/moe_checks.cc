// What a forward pass accepts: the checks run before any rank starts a step, and the KV layout
// a config implies.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "models/moe_model.h"

namespace moeserve {

KvLayout KvLayoutFor(const ModelConfig& c, int64_t num_blocks, int64_t block_size, DType dtype) {
  KvLayout l;
  l.num_blocks = num_blocks;
  l.num_layers = c.num_hidden_layers;
  l.block_size = block_size;
  l.kv_heads = c.num_key_value_heads;
  l.head_dim = c.head_dim;
  if (c.is_mla()) {  // one row per token: the latent, then the shared rotary key
    l.kv_heads = 1;
    l.head_dim = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
    l.planes = 1;
  }
  l.dtype = dtype;
  return l;
}

namespace {

// Every token's id, position, sequence, block-table reach and KV slot.
absl::Status CheckTokens(const ForwardInput& in, const KvLayout& layout, const ModelConfig& c) {
  for (int64_t i = 0; i < in.num_tokens(); ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", in.token_ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
    if (in.positions[i] < 0 || in.positions[i] >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", in.positions[i], " at index ", i,
                       " is outside [0, max_position_embeddings=", c.max_position_embeddings, ")"));
    }
    if (in.token_seq[i] < 0 || in.token_seq[i] >= in.num_seqs) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_seq ", in.token_seq[i], " out of range"));
    }
    const int64_t needed_blocks = in.positions[i] / layout.block_size + 1;
    if (needed_blocks > in.max_blocks_per_seq) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", in.positions[i], " needs ", needed_blocks,
                       " blocks but the block table has ", in.max_blocks_per_seq));
    }
    if (in.slots[i] < 0 || in.slots[i] >= layout.num_blocks * layout.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", in.slots[i], " outside the KV cache"));
    }
  }
  for (int32_t b : in.block_tables) {
    if (b < 0 || b >= layout.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("block id ", b, " outside the KV cache of ", layout.num_blocks, " blocks"));
    }
  }
  return absl::OkStatus();
}

// The logit rows, and the sampling specs and logit edits that go with them.
absl::Status CheckSampling(const ForwardInput& in, const ModelConfig& c) {
  for (int32_t r : in.logit_rows) {
    if (r < 0 || r >= in.num_tokens())
      return absl::InvalidArgumentError(absl::StrCat("logit row ", r, " out of range"));
  }
  if (!in.sample.empty() && in.sample.size() != in.logit_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sample: ", in.sample.size(), " specs for ",
                                                   in.logit_rows.size(), " logit rows"));
  }
  if (!in.logit_edits.empty() && in.sample.empty()) {
    return absl::InvalidArgumentError("logit edits without sampling specs");
  }
  for (size_t i = 0; i < in.logit_edits.size(); ++i) {
    const LogitEdit& e = in.logit_edits[i];
    if (e.row < 0 || e.row >= static_cast<int32_t>(in.logit_rows.size()) || e.token < 0 ||
        e.token >= c.vocab_size || !(e.repetition > 0.0f) || std::isnan(e.bias) || std::isnan(e.subtract)) {
      return absl::InvalidArgumentError(absl::StrCat("logit edit ", i, " out of range: row ", e.row, " of ",
                                                     in.logit_rows.size(), ", token ", e.token, " of ",
                                                     c.vocab_size, ", repetition ", e.repetition));
    }
  }
  for (const SampleSpec& s : in.sample) {
    if (!(s.temperature >= 0.0f) || !(s.top_p > 0.0f && s.top_p <= 1.0f) || s.top_k < 0 ||
        !(s.u >= 0.0 && s.u < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample spec out of range: temperature ", s.temperature, " (>= 0), top_p ",
                       s.top_p, " ((0, 1]), top_k ", s.top_k, " (>= 0), u ", s.u, " ([0, 1))"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeModel::Validate(const ForwardInput& in, const KvLayout& layout) const {
  if (weights_->released()) {
    return absl::FailedPreconditionError(
        "forward: these weights were released (the copy the ranks were sharded from)");
  }
  const ModelConfig& c = config();
  const int64_t t = in.num_tokens();
  if (t == 0 && !expert_parallel()) return absl::InvalidArgumentError("forward: no tokens");
  if (static_cast<int64_t>(in.positions.size()) != t ||
      static_cast<int64_t>(in.token_seq.size()) != t ||
      static_cast<int64_t>(in.slots.size()) != t) {
    return absl::InvalidArgumentError(
        "forward: token_ids, positions, token_seq and slots differ in length");
  }
  if (static_cast<int64_t>(in.block_tables.size()) != in.num_seqs * in.max_blocks_per_seq) {
    return absl::InvalidArgumentError("forward: block_tables is not num_seqs x max_blocks_per_seq");
  }
  if (shard_.layer_begin < 0 || shard_.layer_begin >= shard_.layer_end ||
      shard_.layer_end > c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("forward: layers [", shard_.layer_begin, ", ",
                                                   shard_.layer_end, ") are not a stage of ",
                                                   c.num_hidden_layers, " layers"));
  }
  if (expert_parallel()) {
    bool whole = static_cast<int64_t>(shard_.expert_holders.size()) == shard_.layer_end - shard_.layer_begin;
    for (size_t l = 0; whole && l < shard_.expert_holders.size(); ++l) {
      whole = static_cast<int64_t>(shard_.expert_holders[l].size()) == c.num_local_experts;
      for (size_t e = 0; whole && e < shard_.expert_holders[l].size(); ++e) whole = !shard_.expert_holders[l][e].empty();
    }
    if (!whole) {
      return absl::InvalidArgumentError("forward: expert_holders must name a rank for every expert of every layer");
    }
  }
  const KvLayout want = KvLayoutFor(c, layout.num_blocks, layout.block_size, layout.dtype);
  if (layout.num_layers != shard_.layer_end - shard_.layer_begin || layout.kv_heads != want.kv_heads ||
      layout.head_dim != want.head_dim || layout.planes != want.planes) {
    return absl::InvalidArgumentError("forward: KV layout does not match the model config");
  }
  RETURN_IF_ERROR(CheckTokens(in, layout, c));
  return CheckSampling(in, c);
}

}  // namespace moeserve
