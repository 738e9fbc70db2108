// How far each CPU kernel variant's logits are from the reference path's (float64 accumulation)
// on the default model over a long greedy decode: the reference picks every token, each variant
// is fed the same tokens (teacher forcing), and per step the largest absolute logit difference
// and whether its argmax is the reference's are recorded. Variants this CPU lacks are skipped.
//
//   build/benchmarks/variant_accuracy [STEPS] [PRESET] [KV] [FAMILY]   (default 1000, small, f32, mixtral)
//
// KV: the variants' cache dtype (the reference keeps f32); bf16 also puts the bf16 variants'
// attention on vdpbf16ps. FAMILY: the preset's shape in another family, as make-model's
// --family (deepseek_v3: latent attention, on vdpbf16ps too over a bf16 cache).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/kernel_select.h"
#include "kvcache/kv_storage.h"
#include "models/model_config.h"
#include "models/model_weights.h"
#include "models/moe_model.h"
#include "models/weight_init.h"

namespace moeserve {
namespace {

struct Runner {
  std::string name;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<KvStorage> kv;
  std::unique_ptr<MoeModel> model;
  double max_abs = 0;
  int64_t argmax_agree = 0;
};

constexpr int64_t kBlock = 16;

int Main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 1000;
  const std::string preset = argc > 2 ? argv[2] : "small";
  const DType kv_dtype = argc > 3 && std::string(argv[3]) == "bf16" ? DType::kBF16 : DType::kF32;
  auto config = PresetConfig(preset);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const std::string family_name = argc > 4 ? argv[4] : "mixtral";  // a model_type, as make-model's --family
  const auto family = FamilyFromModelType(family_name);
  if (!family.ok()) {
    std::fprintf(stderr, "%s\n", std::string(family.status().message()).c_str());
    return 2;
  }
  *config = WithFamily(*config, *family);
  const auto tensors = GenerateRandomWeights(*config, 0, config->torch_dtype);
  const int64_t prompt_len = 16, total = prompt_len + steps;
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  std::vector<Runner> runners;
  auto add = [&](const std::string& name, CpuBackendOptions o) {
    Runner r;
    r.name = name;
    o.num_threads = 2;
    r.backend = std::make_unique<CpuBackend>(o);
    auto w = ModelWeights::Load(*config, *tensors, r.backend.get(), config->torch_dtype);
    const DType kv_type = o.path == CpuPath::kReference ? DType::kF32 : kv_dtype;
    auto kv = KvStorage::Create(r.backend.get(), KvLayoutFor(*config, blocks, kBlock, kv_type));
    if (!w.ok() || !kv.ok()) std::abort();
    r.weights = *std::move(w);
    r.kv = std::make_unique<KvStorage>(*std::move(kv));
    r.model = std::make_unique<MoeModel>(r.weights.get(), r.backend.get());
    runners.push_back(std::move(r));
  };
  add("reference (float64 accumulation)", CpuBackendOptions{CpuPath::kReference, 1, 0});
  std::vector<VariantCheck> checks = CheckedVariants();
  // The amx variant's code on the model of the tiles, where the CPU grants none (its rounding is
  // the model's, not the hardware's).
  if (!DetectCpuFeatures().amx_bf16) checks.push_back(SelfCheckVariant(CpuIsa::kAmxModel));
  for (const VariantCheck& v : checks) {
    if (!v.passed) {
      std::printf("%-14s skipped: %s\n", CpuIsaName(v.isa), v.supported ? v.detail.c_str() : v.missing.c_str());
      continue;
    }
    CpuBackendOptions o;
    o.isa = v.isa;
    add(CpuIsaName(v.isa), o);
  }
  std::vector<int32_t> tokens = {256};  // the byte tokenizer's BOS
  for (int64_t i = 1; i < prompt_len; ++i) tokens.push_back(static_cast<int32_t>((i * 37) % 250 + 1));
  std::vector<float> ref_logits, logits;
  int64_t pos = 0;
  double max_logit = 0;
  for (int64_t step = 0; step <= steps; ++step) {
    // The prompt in one step, then one token a step: the reference's choice for everyone.
    ForwardInput in;
    in.num_seqs = 1;
    in.max_blocks_per_seq = blocks;
    for (int64_t b = 0; b < blocks; ++b) in.block_tables.push_back(static_cast<int32_t>(b));
    const int64_t end = step == 0 ? prompt_len : pos + 1;
    for (int64_t p = pos; p < end; ++p) {
      in.token_ids.push_back(tokens[p]);
      in.positions.push_back(static_cast<int32_t>(p));
      in.token_seq.push_back(0);
      in.slots.push_back(p);
    }
    in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
    pos = end;
    int32_t ref_choice = 0;
    for (size_t r = 0; r < runners.size(); ++r) {
      Runner& run = runners[r];
      std::vector<float>& out = r == 0 ? ref_logits : logits;
      if (!run.model->Forward(in, run.kv->layout(), run.kv->data(), &out).ok()) std::abort();
      const int32_t choice = static_cast<int32_t>(std::max_element(out.begin(), out.end()) - out.begin());
      if (r == 0) {
        ref_choice = choice;
        for (float v : out) max_logit = std::max(max_logit, std::fabs(static_cast<double>(v)));
        continue;
      }
      for (size_t i = 0; i < out.size(); ++i) run.max_abs = std::max(run.max_abs, std::fabs(static_cast<double>(out[i]) - ref_logits[i]));
      if (choice == ref_choice) ++run.argmax_agree;
    }
    tokens.push_back(ref_choice);
  }
  std::printf("preset %s (%s), %lld teacher-forced greedy steps after a %lld-token prompt, bf16 weights\n",
              preset.c_str(), family_name.c_str(), static_cast<long long>(steps + 1), static_cast<long long>(prompt_len));
  std::printf("largest |logit| of the reference: %.3g\n", max_logit);
  std::printf("%-14s %18s %22s\n", "variant", "max |logit error|", "argmax = reference's");
  for (size_t r = 1; r < runners.size(); ++r) {
    std::printf("%-14s %18.3g %15lld / %lld\n", runners[r].name.c_str(), runners[r].max_abs,
                static_cast<long long>(runners[r].argmax_agree), static_cast<long long>(steps + 1));
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) { return moeserve::Main(argc, argv); }
