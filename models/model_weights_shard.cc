// ModelWeights::Shard: a rank's part of weights already loaded, copied onto its own device.
#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "core/status.h"
#include "kernels/weight_layout.h"
#include "models/model_weights.h"
#include "models/weight_shard.h"
#include "models/weight_uploader.h"

namespace moeserve {

namespace {

// Copies a shard's tensors from one backend to another, through host memory.
struct ShardCopier {
  Backend* from;
  Backend* to;
  std::vector<DeviceBuffer>* buffers;  // the shard's, which own the copies
  size_t* total_bytes;
  std::vector<uint8_t> host;

  absl::StatusOr<const void*> Bytes(const void* src, size_t bytes) {
    host.resize(bytes);
    RETURN_IF_ERROR(from->CopyToHost(host.data(), src, bytes));
    ASSIGN_OR_RETURN(DeviceBuffer buf, to->Allocate(bytes));
    RETURN_IF_ERROR(to->CopyToDevice(buf.data(), host.data(), bytes));
    const void* data = buf.data();
    *total_bytes += buf.bytes();  // as allocated, as CommitExperts gives it back
    buffers->push_back(std::move(buf));
    return data;
  }
  // A GEMM operand moves in the destination's preferred layout (re-tiled on the host if the
  // source backend prefers another).
  absl::StatusOr<WeightRef> Matrix(const WeightRef& m) {
    WeightRef out = m;
    if (m.data == nullptr) return out;
    if (m.dtype == DType::kF8E4M3) {  // row-major bytes and their scales, as stored
      ASSIGN_OR_RETURN(out.data, Bytes(m.data, static_cast<size_t>(m.rows * m.cols)));
      const size_t groups = static_cast<size_t>((m.cols + kFp8ScaleCols - 1) / kFp8ScaleCols);
      ASSIGN_OR_RETURN(const void* scales, Bytes(m.scales, static_cast<size_t>(m.rows) * groups * sizeof(float)));
      out.scales = static_cast<const float*>(scales);
      return out;
    }
    const WeightLayout want = to->PreferredWeightLayout(m.dtype);
    const size_t eb = DTypeSize(m.dtype);
    if (m.layout == want) {
      ASSIGN_OR_RETURN(out.data, Bytes(m.data, static_cast<size_t>(WeightStorageElems(m.layout, m.rows, m.cols)) * eb));
      return out;
    }
    host.resize(static_cast<size_t>(WeightStorageElems(m.layout, m.rows, m.cols)) * eb);
    RETURN_IF_ERROR(from->CopyToHost(host.data(), m.data, host.size()));
    std::vector<uint8_t> row_major(static_cast<size_t>(m.rows * m.cols) * eb);
    UnpackWeight(m.layout, host.data(), m.rows, m.cols, eb, row_major.data());
    ASSIGN_OR_RETURN(DeviceBuffer buf, UploadWeight(to, row_major.data(), m.dtype, m.rows, m.cols, want));
    out.data = buf.data();
    out.layout = want;
    *total_bytes += buf.bytes();
    buffers->push_back(std::move(buf));
    return out;
  }
  absl::StatusOr<const float*> Vec(const float* v, int64_t n) {
    if (v == nullptr) return nullptr;
    ASSIGN_OR_RETURN(const void* data, Bytes(v, static_cast<size_t>(n) * sizeof(float)));
    return static_cast<const float*>(data);
  }
};

// A pipeline stage's copy of a layer's MLA weights (ModelWeights::Shard).
template <typename Matrix, typename Vec>
absl::Status ShardMla(const ModelConfig& c, const LayerWeights& f, Matrix& matrix, Vec& vec, LayerWeights* lw) {
  ASSIGN_OR_RETURN(lw->q_a_norm, vec(f.q_a_norm, c.mla.q_lora_rank));
  ASSIGN_OR_RETURN(lw->kv_a_norm, vec(f.kv_a_norm, c.mla.kv_lora_rank));
  for (auto [dst, src] : {std::pair{&lw->q_a, &f.q_a}, {&lw->q_nope, &f.q_nope}, {&lw->q_rope, &f.q_rope},
                          {&lw->kv_a, &f.kv_a}, {&lw->k_rope, &f.k_rope}}) {
    ASSIGN_OR_RETURN(*dst, matrix(*src));
  }
  for (const WeightRef& k : f.k_up_t) {
    ASSIGN_OR_RETURN(WeightRef m, matrix(k));
    lw->k_up_t.push_back(m);
  }
  for (const WeightRef& v : f.v_up) {
    ASSIGN_OR_RETURN(WeightRef m, matrix(v));
    lw->v_up.push_back(m);
  }
  return absl::OkStatus();
}


// A pipeline stage's copy of one of its layers: norms, attention, router, its EP rank's experts,
// the shared expert (ModelWeights::Shard).
template <typename Matrix, typename Vec>
absl::Status ShardLayer(const ModelConfig& c, const LayerWeights& f, const std::vector<bool>& held, Matrix& matrix,
                        Vec& vec, LayerWeights* lw) {
  ASSIGN_OR_RETURN(lw->attn_norm, vec(f.attn_norm, c.hidden_size));
  ASSIGN_OR_RETURN(lw->mlp_norm, vec(f.mlp_norm, c.hidden_size));
  ASSIGN_OR_RETURN(lw->q, matrix(f.q));
  ASSIGN_OR_RETURN(lw->k, matrix(f.k));
  ASSIGN_OR_RETURN(lw->v, matrix(f.v));
  ASSIGN_OR_RETURN(lw->o, matrix(f.o));
  ASSIGN_OR_RETURN(lw->q_bias, vec(f.q_bias, c.q_dim()));
  ASSIGN_OR_RETURN(lw->k_bias, vec(f.k_bias, c.kv_dim()));
  ASSIGN_OR_RETURN(lw->v_bias, vec(f.v_bias, c.kv_dim()));
  const bool per_head = c.qk_norm == QkNorm::kPerHead;
  ASSIGN_OR_RETURN(lw->q_norm, vec(f.q_norm, per_head ? c.head_dim : c.q_dim()));
  ASSIGN_OR_RETURN(lw->k_norm, vec(f.k_norm, per_head ? c.head_dim : c.kv_dim()));
  ASSIGN_OR_RETURN(lw->router, matrix(f.router));
  for (size_t e = 0; e < f.w13.size(); ++e) {
    if (!held[e]) continue;
    ASSIGN_OR_RETURN(lw->w13[e], matrix(f.w13[e]));
    ASSIGN_OR_RETURN(lw->w2[e], matrix(f.w2[e]));
  }
  ASSIGN_OR_RETURN(lw->shared_w13, matrix(f.shared_w13));
  ASSIGN_OR_RETURN(lw->shared_w2, matrix(f.shared_w2));
  ASSIGN_OR_RETURN(lw->shared_gate, matrix(f.shared_gate));
  ASSIGN_OR_RETURN(lw->router_bias, vec(f.router_bias, c.num_local_experts));
  if (c.is_mla()) RETURN_IF_ERROR(ShardMla(c, f, matrix, vec, lw));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Shard(const ModelWeights& full, Backend* from,
                                                                   const WeightShard& shard, Backend* to) {
  if (full.released_) return absl::FailedPreconditionError("weight shard: the full weights were released");
  const ModelConfig& c = full.config_;
  ASSIGN_OR_RETURN(const std::vector<std::vector<bool>> held, HeldExperts(c, shard));
  const int64_t end = shard.layer_end < 0 ? c.num_hidden_layers : shard.layer_end;
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  w->config_ = c;
  w->dtype_ = full.dtype_;
  w->content_digest_ = full.content_digest_;
  ShardCopier copier{from, to, &w->buffers_, &w->total_bytes_, {}};
  auto matrix = [&](const WeightRef& m) { return copier.Matrix(m); };
  auto vec = [&](const float* v, int64_t n) { return copier.Vec(v, n); };
  auto shape_only = [](WeightRef m) {
    m.data = nullptr;
    return m;
  };
  const bool first = shard.layer_begin == 0, last = end == c.num_hidden_layers;
  w->embed_ = shape_only(full.embed_);
  if (first) {
    ASSIGN_OR_RETURN(w->embed_, matrix(full.embed_));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& f = full.layers_[l];
    LayerWeights lw;
    const bool mine = l >= shard.layer_begin && l < end;
    for (size_t e = 0; e < f.w13.size(); ++e) {  // none in a dense layer
      lw.w13.push_back(shape_only(f.w13[e]));
      lw.w2.push_back(shape_only(f.w2[e]));
    }
    if (mine) {
      RETURN_IF_ERROR(ShardLayer(c, f, held[static_cast<size_t>(l - shard.layer_begin)], matrix, vec, &lw));
    }
    w->layers_.push_back(std::move(lw));
  }
  w->lm_head_ = shape_only(full.lm_head_);
  if (last) {
    ASSIGN_OR_RETURN(w->final_norm_, vec(full.final_norm_, c.hidden_size));
    if (c.tie_word_embeddings && first) {
      w->lm_head_ = w->embed_;
    } else {
      ASSIGN_OR_RETURN(w->lm_head_, matrix(full.lm_head_));
    }
  }
  return w;
}

absl::StatusOr<StagedExperts> ModelWeights::StageExperts(std::span<const ExpertOrigin> sources,
                                                       const WeightShard& shard, Backend* to) const {
  for (size_t k = 0; k < sources.size(); ++k) {
    const ModelWeights& src = *sources[k].weights;
    if (src.released_) {
      return absl::FailedPreconditionError(absl::StrCat("re-placing experts: source ", k, " of ", sources.size(),
                                                        ": its weights were released"));
    }
    if (src.layers_.size() != layers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("re-placing experts: source ", k, " of ", sources.size(), " has ",
                                                     src.layers_.size(), " layers, this shard ", layers_.size()));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::vector<bool>> held, HeldExperts(config_, shard));
  const int64_t end = shard.layer_end < 0 ? config_.num_hidden_layers : shard.layer_end;
  StagedExperts out;
  out.layer_begin = shard.layer_begin;
  out.held = held;
  std::vector<ShardCopier> copiers;  // one per source: its host buffer is reused
  for (const ExpertOrigin& src : sources) copiers.push_back(ShardCopier{src.backend, to, &out.buffers, &out.bytes, {}});
  for (int64_t l = shard.layer_begin; l < end; ++l) {
    const std::vector<bool>& h = held[static_cast<size_t>(l - shard.layer_begin)];
    const LayerWeights& mine = layers_[static_cast<size_t>(l)];
    for (size_t e = 0; e < mine.w13.size(); ++e) {
      if (!h[e] || mine.w13[e].data != nullptr) continue;
      size_t k = 0;  // the first source that holds it
      while (k < sources.size() && !HoldsExpert(*sources[k].weights, l, e)) ++k;
      if (k == sources.size()) {
        return absl::NotFoundError(absl::StrCat("re-placing experts: no source holds layer ", l, "'s expert ", e));
      }
      const LayerWeights& source = sources[k].weights->layers_[static_cast<size_t>(l)];
      StagedExperts::Copy c{l, e, {}, {}};
      ASSIGN_OR_RETURN(c.w13, copiers[k].Matrix(source.w13[e]));
      ASSIGN_OR_RETURN(c.w2, copiers[k].Matrix(source.w2[e]));
      out.copies.push_back(c);
    }
  }
  return out;
}

bool ModelWeights::HoldsExpert(const ModelWeights& w, int64_t layer, size_t expert) {
  const LayerWeights& lw = w.layers_[static_cast<size_t>(layer)];
  return expert < lw.w13.size() && lw.w13[expert].data != nullptr;
}

void ModelWeights::CommitExperts(StagedExperts staged) {
  std::unordered_set<const void*> dropped;
  for (size_t i = 0; i < staged.held.size(); ++i) {
    LayerWeights& mine = layers_[static_cast<size_t>(staged.layer_begin) + i];
    for (size_t e = 0; e < mine.w13.size(); ++e) {
      if (mine.w13[e].data == nullptr || staged.held[i][e]) continue;
      for (WeightRef* m : {&mine.w13[e], &mine.w2[e]}) {
        dropped.insert(m->data);
        if (m->scales != nullptr) dropped.insert(m->scales);
        m->data = nullptr;
        m->scales = nullptr;
      }
    }
  }
  // One pass over the buffers: a shard of a large model holds thousands.
  std::erase_if(buffers_, [&](const DeviceBuffer& b) {
    if (dropped.count(b.data()) == 0) return false;
    total_bytes_ -= std::min(total_bytes_, b.bytes());
    return true;
  });
  for (const StagedExperts::Copy& c : staged.copies) {
    layers_[static_cast<size_t>(c.layer)].w13[c.expert] = c.w13;
    layers_[static_cast<size_t>(c.layer)].w2[c.expert] = c.w2;
  }
  for (DeviceBuffer& b : staged.buffers) buffers_.push_back(std::move(b));
  total_bytes_ += staged.bytes;
}

}  // namespace moeserve
