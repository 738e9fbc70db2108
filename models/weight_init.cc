// Seeded weight generation.
#include "models/weight_init.h"

#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "core/rng.h"
#include "models/tensor_names.h"

namespace moeserve {

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
    shapes_[e.name] = e.shape;
    order_.push_back(e.name);
  }
}

const TensorView* GeneratedTensors::Find(const std::string& name) const {
  auto shape = shapes_.find(name);
  if (shape == shapes_.end()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (const TensorView* t = made_.Find(name)) return t;
  void* p = made_.Add(name, dtype_, shape->second);
  const TensorView* t = made_.Find(name);
  Fill(config_, seed_, *t, p, dtype_);
  return t;
}

bool GeneratedTensors::Has(const std::string& name) const { return shapes_.count(name) > 0; }

std::vector<std::string> GeneratedTensors::Names() const { return order_; }

int64_t GeneratedTensors::generated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(made_.Names().size());
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
