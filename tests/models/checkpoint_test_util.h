// Helpers of the checkpoint tests (deepseek_test.cc, fp8_checkpoint_test.cc): fixture paths, a
// checkpoint with tensors replaced, and a prefill's logits against transformers'.
#pragma once

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"

namespace moeserve::checkpoint_test {

inline std::string Fixture(const std::string& rel) { return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/" + rel; }

inline nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

// A checkpoint with some tensors replaced or added.
class PatchedSource : public TensorSource {
 public:
  explicit PatchedSource(const TensorSource& base) : base_(base) {}
  void Set(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    SetRaw(name, std::move(shape), DType::kF32, std::move(bytes));
  }
  void SetRaw(const std::string& name, std::vector<int64_t> shape, DType dtype, std::vector<uint8_t> bytes) {
    values_[name] = std::move(bytes);
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.data = values_[name].data();
    v.bytes = values_[name].size();
    views_[name] = v;
  }
  void Remove(const std::string& name) { removed_.insert(name); }
  const TensorView* Find(const std::string& name) const override {
    if (removed_.count(name) > 0) return nullptr;
    auto it = views_.find(name);
    return it != views_.end() ? &it->second : base_.Find(name);
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const std::string& n : base_.Names()) {
      if (removed_.count(n) == 0) names.push_back(n);
    }
    for (const auto& [n, v] : views_) {
      if (base_.Find(n) == nullptr) names.push_back(n);
    }
    return names;
  }

 private:
  const TensorSource& base_;
  std::map<std::string, std::vector<uint8_t>> values_;
  std::map<std::string, TensorView> views_;
  std::set<std::string> removed_;
};

// One prefill of `ids` (logits at every position).
inline std::vector<float> PrefillLogits(const ModelConfig& config, const ModelWeights& weights, Backend* backend,
                                 const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), block = 16;
  auto kv = KvStorage::Create(backend, KvLayoutFor(config, (n + block - 1) / block, block, DType::kF32));
  EXPECT_TRUE(kv.ok());
  MoeModel model(&weights, backend);
  ForwardInput in;
  in.token_ids = ids;
  in.num_seqs = 1;
  in.max_blocks_per_seq = (n + block - 1) / block;
  for (int64_t i = 0; i < n; ++i) {
    in.positions.push_back(static_cast<int32_t>(i));
    in.token_seq.push_back(0);
    in.slots.push_back(i);
    in.logit_rows.push_back(static_cast<int32_t>(i));
  }
  for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) in.block_tables.push_back(static_cast<int32_t>(b));
  std::vector<float> logits;
  EXPECT_TRUE(model.Forward(in, kv->layout(), kv->data(), &logits).ok());
  return logits;
}

// Max-abs error of the first fixture prompt's logits (every position, one prefill) against
// transformers', with `config` in place of the checkpoint's; with `against`, the error of that
// model's logits against this one's instead.
inline double LogitError(const ModelConfig& config, const TensorSource& source, const std::string& dir,
                  DType storage = DType::kF32, const std::unique_ptr<ModelWeights>* against = nullptr) {
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference, 1, 0});
  auto weights = ModelWeights::Load(config, source, &backend, storage);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return INFINITY;
  const nlohmann::json expected = ReadJson(dir + "/expected.json");
  const auto ids = expected["cases"][0]["ids"].get<std::vector<int32_t>>();
  const std::vector<float> mine = PrefillLogits(config, **weights, &backend, ids);
  std::vector<float> want(mine.size()), got = mine;
  if (against != nullptr) {
    // Exact numerics: the bf16 variants would round activations for the bf16 lm_head.
    CpuBackend fast(CpuBackendOptions{CpuPath::kFast, 1, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
    want = mine;
    got = PrefillLogits(config, **against, &fast, ids);
  } else {
    std::ifstream f(dir + "/" + expected["cases"][0]["logits"].get<std::string>(), std::ios::binary);
    f.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(float)));
  }
  if (got.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(double{got[i]} - want[i]));
  return err;
}

}  // namespace moeserve::checkpoint_test
