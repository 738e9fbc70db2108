// Seeded weight generation.
#include "models/weight_init.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "core/rng.h"
#include "core/status.h"
#include "models/tensor_names.h"
#include "models/weight_shard.h"

namespace moeserve {
namespace tn = tensor_names;

void* HostTensorSet::Add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.bytes = static_cast<size_t>(v.numel()) * DTypeSize(dtype);
  storage_.push_back(std::make_unique<uint8_t[]>(v.bytes));  // value-initialised: zeros
  v.data = storage_.back().get();
  order_.push_back(name);
  views_[name] = v;
  return storage_.back().get();
}

const TensorView* HostTensorSet::Find(const std::string& name) const {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

std::vector<std::string> HostTensorSet::Names() const { return order_; }

std::vector<TensorView> HostTensorSet::Ordered() const {
  std::vector<TensorView> out;
  for (const auto& n : order_) out.push_back(views_.at(n));
  return out;
}

namespace {

// Standard deviation of a tensor's initial values; negative means "constant 1" (norms).
double InitStd(const ModelConfig& c, const std::string& name, const std::vector<int64_t>& shape) {
  if (absl::StrContains(name, "norm")) return -1.0;
  if (absl::StrContains(name, "embed_tokens")) return 1.0;
  const double fan_in = static_cast<double>(shape.back());
  double std = 1.0 / std::sqrt(fan_in);
  if (absl::StrContains(name, "lm_head")) std *= 2.0;  // logits with standard deviation ~2
  // Projections that write into the residual stream.
  if (absl::StrContains(name, "o_proj") || absl::StrContains(name, ".w2.") ||
      absl::StrContains(name, "down_proj")) {
    std /= std::sqrt(2.0 * c.num_hidden_layers);
  }
  return std;
}

void Fill(const ModelConfig& c, uint64_t seed, const TensorView& t, void* out, DType dtype) {
  const double std = InitStd(c, t.name, t.shape);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> values(n);
  if (std < 0) {
    std::fill(values.begin(), values.end(), 1.0f);
  } else {
    Rng rng(seed ^ HashString(t.name));
    const float a = static_cast<float>(std * std::sqrt(3.0));  // uniform(-a, a) has this std
    for (auto& v : values) v = (2.0f * rng.UniformFloat() - 1.0f) * a;
  }
  ConvertFromF32(values.data(), n, dtype, out);
}

}  // namespace

GeneratedTensors::GeneratedTensors(const ModelConfig& config, uint64_t seed, DType dtype)
    : config_(config), seed_(seed), dtype_(dtype) {
  for (const auto& e : ExpectedTensors(config)) {
    entries_[e.name].shape = e.shape;
    order_.push_back(e.name);
  }
}

const TensorView* GeneratedTensors::Find(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return nullptr;
  const Entry& e = it->second;
  std::call_once(e.once, [&] {
    TensorView& v = e.view;
    v.name = name;
    v.dtype = dtype_;
    v.shape = e.shape;
    v.bytes = static_cast<size_t>(v.numel()) * DTypeSize(dtype_);
    e.data.reset(new uint8_t[std::max<size_t>(v.bytes, 1)]);  // Fill writes every byte
    v.data = e.data.get();
    Fill(config_, seed_, v, e.data.get(), dtype_);
    generated_.fetch_add(1);
  });
  return &e.view;
}

bool GeneratedTensors::Has(const std::string& name) const { return entries_.count(name) > 0; }

std::vector<std::string> GeneratedTensors::Names() const { return order_; }

void GeneratedTensors::Make(const std::vector<std::string>& names, ThreadPool& pool) const {
  pool.ParallelFor(static_cast<int64_t>(names.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) Find(names[static_cast<size_t>(i)]);
  });
}

absl::StatusOr<std::vector<std::string>> ShardTensorNames(const ModelConfig& c, const WeightShard& only) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<bool>> held, HeldExperts(c, only));
  const int64_t end = only.layer_end < 0 ? c.num_hidden_layers : only.layer_end;
  std::set<std::string> skip;  // the experts of its layers it does not hold
  for (int64_t l = only.layer_begin; l < end; ++l) {
    for (int64_t e = 0; e < (c.dense_layer(l) ? 0 : c.num_local_experts); ++e) {
      if (held[static_cast<size_t>(l - only.layer_begin)][static_cast<size_t>(e)]) continue;
      for (const char* w : {"w1", "w2", "w3"}) skip.insert(tn::Expert(c, l, e, w));
    }
  }
  const bool first = only.layer_begin == 0, last = end == c.num_hidden_layers;
  const std::string prefix = tn::Layer(0, "").substr(0, tn::Layer(0, "").size() - 2);  // "model.layers."
  std::vector<std::string> out;
  for (const auto& t : ExpectedTensors(c)) {
    int64_t layer = -1;  // the layer a "model.layers.N." tensor belongs to
    if (t.name.starts_with(prefix)) layer = std::strtoll(t.name.c_str() + prefix.size(), nullptr, 10);
    const bool in_layers = layer >= only.layer_begin && layer < end;
    const bool routed_expert = t.name.find(".experts.") != std::string::npos;
    if (skip.count(t.name) > 0) continue;
    if (only.experts_only) {
      if (in_layers && routed_expert) out.push_back(t.name);
      continue;
    }
    const bool table = t.name == tn::Embed()                                 ? first || (last && c.tie_word_embeddings)
                       : t.name == tn::FinalNorm() || t.name == tn::LmHead() ? last
                                                                              : false;
    if (in_layers || table) out.push_back(t.name);
  }
  return out;
}

std::unique_ptr<HostTensorSet> GenerateRandomWeights(const ModelConfig& config, uint64_t seed,
                                                     DType dtype, ThreadPool* pool) {
  auto set = std::make_unique<HostTensorSet>();
  std::vector<std::pair<const TensorView*, void*>> jobs;
  for (const auto& e : ExpectedTensors(config)) {
    void* p = set->Add(e.name, dtype, e.shape);
    jobs.emplace_back(set->Find(e.name), p);
  }
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) Fill(config, seed, *jobs[i].first, jobs[i].second, dtype);
  };
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int64_t>(jobs.size()), 1, run);
  } else {
    run(0, static_cast<int64_t>(jobs.size()));
  }
  return set;
}

}  // namespace moeserve
