// See attention_self_check.h.
#include "kernels/cpu/attention_self_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_bound.h"
#include "kernels/cpu/attention_latent.h"
#include "kernels/cpu/fast_ops.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kLayer = 1;  // of two: a wrong layer offset reads the other's values
// Contexts: past the first 512-key chunk, a prefill chunk of its last 20 tokens, the shortest,
// and one past two blocks.
constexpr int64_t kLens[] = {601, 120, 1, 41};
constexpr int64_t kPrefillSeq = 1, kPrefillTokens = 20;
// Shapes the bf16 kernels take (attention_bf16.h, attention_latent.h).
constexpr int64_t kHeadDim = 64, kLatentDim = 128, kRopeDim = 32;

// A paged cache of random values (every slot, both layers) in blocks of 16 taken in random
// order, and the tokens that attend: each sequence's last, the prefill sequence's last 20.
struct CheckBatch {
  KvLayout layout;
  int64_t max_blocks = 0;
  std::vector<int32_t> tables, token_seq, token_pos;
  std::vector<uint8_t> cache;

  int64_t tokens() const { return static_cast<int64_t>(token_seq.size()); }
  int64_t seqs() const { return static_cast<int64_t>(std::size(kLens)); }
  AttentionBatch Batch() const {
    return {token_seq.data(), token_pos.data(), tables.data(), tokens(), seqs(), max_blocks};
  }
  AttentionBatch Alone(int64_t i) const {
    return {&token_seq[i], &token_pos[i], tables.data(), 1, seqs(), max_blocks};
  }
  // Element `e` of key j's row (plane `plane`) of sequence s, as a double.
  double At(int plane, int64_t s, int64_t j, int64_t e) const {
    const int64_t bs = layout.block_size;
    const int64_t off = layout.Offset(tables[s * max_blocks + j / bs], kLayer, plane, j % bs) + e;
    if (layout.dtype == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, cache.data() + off * 2, sizeof(h));
      return Bf16ToF32(h);
    }
    float f;
    std::memcpy(&f, cache.data() + off * 4, sizeof(f));
    return f;
  }
};

std::vector<float> Random(int64_t n, float spread, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-spread, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

CheckBatch MakeBatch(KvLayout layout, std::mt19937& gen) {
  CheckBatch b;
  int64_t blocks = 0;  // as many as the sequences fill: the random fill is most of the check's time
  for (int64_t len : kLens) {
    b.max_blocks = std::max(b.max_blocks, (len + 15) / 16);
    blocks += (len + 15) / 16;
  }
  layout.num_layers = 2;
  layout.block_size = 16;
  layout.num_blocks = blocks;
  b.layout = layout;
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  b.tables.assign(static_cast<size_t>(b.seqs() * b.max_blocks), 0);  // entries past a sequence's end unread
  for (int64_t s = 0, next = 0; s < b.seqs(); ++s) {
    for (int64_t i = 0; i < (kLens[s] + 15) / 16; ++i) b.tables[s * b.max_blocks + i] = order[next++];
  }
  const int64_t elems = layout.num_blocks * layout.BlockElems();
  b.cache.resize(static_cast<size_t>(elems) * DTypeSize(layout.dtype));
  const std::vector<float> values = Random(elems, 1.0f, gen);
  ConvertFromF32(values.data(), values.size(), layout.dtype, b.cache.data());
  for (int64_t s = 0; s < b.seqs(); ++s) {
    const int64_t n = s == kPrefillSeq ? kPrefillTokens : 1;
    for (int64_t p = kLens[s] - n; p < kLens[s]; ++p) {
      b.token_seq.push_back(static_cast<int32_t>(s));
      b.token_pos.push_back(static_cast<int32_t>(p));
    }
  }
  return b;
}

// Each token's output (`row_floats` floats) run alone by `run`, bit for bit against the batch's
// `out`; empty when every token agrees.
template <typename RunAlone>
std::string CheckAlone(const CheckBatch& b, int64_t row_floats, const std::vector<float>& out, const RunAlone& run,
                       const char* what) {
  std::vector<float> alone(static_cast<size_t>(row_floats));
  for (int64_t i = 0; i < b.tokens(); ++i) {
    run(i, alone.data());
    if (std::memcmp(alone.data(), out.data() + i * row_floats, alone.size() * sizeof(float)) != 0) {
      return absl::StrFormat("%s over a %s cache: token %d (position %d) alone differs from itself in the batch "
                             "(not batch-invariant)",
                             what, DTypeShortName(b.layout.dtype), i, b.token_pos[i]);
    }
  }
  return "";
}

std::string BoundFailure(const char* what, DType dtype, const AttentionBound& bound) {
  return absl::StrFormat("%s over a %s cache: |error| %.3g against float64 is %.3g of its bound", what,
                         DTypeShortName(dtype), bound.worst_err, bound.worst);
}

}  // namespace

std::string CheckPagedAttention(const PagedAttentionFn& attend, DType kv_dtype, bool bf16, std::mt19937& gen,
                                AttentionCheckErrors* errors) {
  constexpr int64_t kKvHeads = 2, kHd = kHeadDim, kQHeads = 6;  // three query heads a kv head
  KvLayout layout;
  layout.kv_heads = kKvHeads;
  layout.head_dim = kHd;
  layout.dtype = kv_dtype;
  const CheckBatch b = MakeBatch(layout, gen);
  const std::vector<float> q = Random(b.tokens() * kQHeads * kHd, 2.0f, gen);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHd));
  std::vector<float> out(q.size());
  attend(q.data(), b.Batch(), b.layout, kLayer, b.cache.data(), kQHeads, scale, out.data());
  AttentionBound bound;
  for (int64_t i = 0; i < b.tokens(); ++i) {
    const int64_t s = b.token_seq[i];
    for (int64_t h = 0; h < kQHeads; ++h) {
      const float* qr = q.data() + (i * kQHeads + h) * kHd;
      const int64_t g = h / (kQHeads / kKvHeads);
      CheckAttentionRow(
          b.token_pos[i] + 1, kHd, kHd, scale, bf16, [&](int64_t e) { return double{qr[e]}; },
          [&](int64_t j, int64_t e) { return b.At(0, s, j, g * kHd + e); },
          [&](int64_t j, int64_t e) { return b.At(1, s, j, g * kHd + e); }, out.data() + (i * kQHeads + h) * kHd,
          &bound);
    }
  }
  errors->paged = std::max(errors->paged, bound.worst);
  if (!(bound.worst <= 1.0)) return BoundFailure("paged attention", kv_dtype, bound);
  return CheckAlone(b, kQHeads * kHd, out, [&](int64_t i, float* row) {
    attend(q.data() + i * kQHeads * kHd, b.Alone(i), b.layout, kLayer, b.cache.data(), kQHeads, scale, row);
  }, "paged attention");
}

std::string CheckLatentAttention(const LatentAttentionFn& attend, DType kv_dtype, bool bf16, std::mt19937& gen,
                                 AttentionCheckErrors* errors) {
  constexpr int64_t kLatent = kLatentDim, kRope = kRopeDim, kHeads = 4;
  KvLayout layout;
  layout.kv_heads = 1;
  layout.head_dim = kLatent + kRope;
  layout.planes = 1;
  layout.dtype = kv_dtype;
  const CheckBatch b = MakeBatch(layout, gen);
  const std::vector<float> ql = Random(b.tokens() * kHeads * kLatent, 2.0f, gen);
  const std::vector<float> qr = Random(b.tokens() * kHeads * kRope, 2.0f, gen);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kLatent + kRope));
  std::vector<float> out(ql.size());
  attend(ql.data(), qr.data(), b.Batch(), b.layout, kLayer, b.cache.data(), kHeads, kLatent, scale, out.data());
  AttentionBound bound;
  for (int64_t i = 0; i < b.tokens(); ++i) {
    const int64_t s = b.token_seq[i];
    for (int64_t h = 0; h < kHeads; ++h) {
      auto q = [&](int64_t e) {
        return e < kLatent ? double{ql[(i * kHeads + h) * kLatent + e]}
                           : double{qr[(i * kHeads + h) * kRope + e - kLatent]};
      };
      auto row = [&](int64_t j, int64_t e) { return b.At(0, s, j, e); };  // the latent doubles as the value
      CheckAttentionRow(b.token_pos[i] + 1, kLatent + kRope, kLatent, scale, bf16, q, row, row,
                        out.data() + (i * kHeads + h) * kLatent, &bound);
    }
  }
  errors->latent = std::max(errors->latent, bound.worst);
  if (!(bound.worst <= 1.0)) return BoundFailure("latent attention", kv_dtype, bound);
  return CheckAlone(b, kHeads * kLatent, out, [&](int64_t i, float* row) {
    attend(ql.data() + i * kHeads * kLatent, qr.data() + i * kHeads * kRope, b.Alone(i), b.layout, kLayer,
           b.cache.data(), kHeads, kLatent, scale, row);
  }, "latent attention");
}

std::string CheckAttentionKernels(CpuIsa isa, ThreadPool& pool, std::mt19937& gen, AttentionCheckErrors* errors) {
  const AttentionKernel kernel = AttentionKernelOf(isa);
  for (DType dtype : {DType::kBF16, DType::kF32}) {  // an f32 cache takes the exact kernel on every variant
    const PagedAttentionFn paged = [&](const float* q, const AttentionBatch& batch, const KvLayout& layout,
                                       int64_t layer, const void* cache, int64_t q_heads, float scale, float* out) {
      PagedAttention(pool, q, batch, layout, layer, cache, q_heads, scale, out, kernel);
    };
    // Whether the kernels round queries and probabilities: a bf16 kernel over a cache and shape it takes.
    const bool bf16 = dtype == DType::kBF16 && kernel != AttentionKernel::kExact;
    if (std::string e = CheckPagedAttention(paged, dtype, bf16 && Bf16AttentionHeadDim(kHeadDim), gen, errors);
        !e.empty()) {
      return e;
    }
    const LatentAttentionFn mla = [&](const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                                      const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                                      int64_t latent_dim, float scale, float* out) {
      PagedLatentAttention(pool, q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim, scale, out, kernel);
    };
    const bool latent_bf16 = bf16 && Bf16LatentShape(kLatentDim + kRopeDim, kLatentDim);
    if (std::string e = CheckLatentAttention(mla, dtype, latent_bf16, gen, errors); !e.empty()) return e;
  }
  return "";
}

}  // namespace moeserve::cpu_fast
