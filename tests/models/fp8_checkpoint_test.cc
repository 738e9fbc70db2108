// FP8 checkpoints beyond the family test's match with transformers: damaged ones refused at load
// naming the tensor, and --quantization fp8 computing exactly its dequantized model.
#include <cstdio>

#include "kernels/cpu/cpu_isa.h"
#include "models/host_matrix.h"
#include "tests/models/checkpoint_test_util.h"

namespace moeserve {
namespace {

using checkpoint_test::Fixture;
using checkpoint_test::LogitError;
using checkpoint_test::PatchedSource;

// A damaged FP8 checkpoint is refused at load naming the tensor and the problem.
TEST(DeepseekModelTest, DamagedFp8CheckpointsAreRefusedNamingTheTensor) {
  const std::string dir = Fixture("hf/deepseekv3fp8");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->fp8_checkpoint);
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::string w = "model.layers.1.self_attn.o_proj.weight";
  const TensorView* weight = (*checkpoint)->Find(w);
  const TensorView* scale = (*checkpoint)->Find(w + "_scale_inv");
  ASSERT_TRUE(weight != nullptr && scale != nullptr);
  ASSERT_EQ(weight->dtype, DType::kF8E4M3);
  const std::vector<uint8_t> wbytes(static_cast<const uint8_t*>(weight->data),
                                    static_cast<const uint8_t*>(weight->data) + weight->bytes);
  std::vector<float> scales(static_cast<size_t>(scale->numel()));
  ConvertToF32(scale->data, scale->dtype, scales.size(), scales.data());
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0});
  auto expect_refused = [&](const PatchedSource& src, const std::string& want, const char* what) {
    auto loaded = ModelWeights::Load(*config, src, &backend, DType::kF32);
    ASSERT_FALSE(loaded.ok()) << what;
    EXPECT_NE(loaded.status().message().find(want), std::string::npos) << what << ": " << loaded.status();
  };
  {
    PatchedSource src(**checkpoint);
    src.Remove(w + "_scale_inv");
    expect_refused(src, "\"" + w + "\" is FP8 but the checkpoint has no", "a missing scale");
  }
  {
    PatchedSource src(**checkpoint);
    src.Set(w + "_scale_inv", {1, static_cast<int64_t>(scales.size())}, scales);
    expect_refused(src, w + "_scale_inv\" has shape", "a scale of the wrong shape");
  }
  for (float bad : {0.0f, std::nanf(""), -1.0f}) {
    PatchedSource src(**checkpoint);
    std::vector<float> s2 = scales;
    s2[0] = bad;
    src.Set(w + "_scale_inv", scale->shape, s2);
    expect_refused(src, "must be finite and positive", "a bad scale");
  }
  {
    PatchedSource src(**checkpoint);
    std::vector<uint8_t> nan = wbytes;
    nan[5] = 0x7f;
    src.SetRaw(w, weight->shape, DType::kF8E4M3, nan);
    expect_refused(src, "element 5 is an FP8 NaN", "a NaN weight");
  }
  {
    PatchedSource src(**checkpoint);
    std::vector<float> as_f32(wbytes.size());
    for (size_t i = 0; i < wbytes.size(); ++i) as_f32[i] = F8E4M3ToF32(wbytes[i]);
    src.Set(w, weight->shape, as_f32);
    expect_refused(src, "rather than F8_E4M3", "a scaled tensor of the wrong dtype");
  }
  {
    ModelConfig no_quant = *config;
    no_quant.fp8_checkpoint = false;
    auto loaded = ModelWeights::Load(no_quant, **checkpoint, &backend, DType::kF32);
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find("no quantization_config"), std::string::npos) << loaded.status();
  }
  // The undamaged checkpoint stays FP8 in memory: about a byte per weight of the FP8 tensors.
  auto fp8 = ModelWeights::Load(*config, **checkpoint, &backend, DType::kF32);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ((*fp8)->layer(1).o.dtype, DType::kF8E4M3);
  EXPECT_EQ((*fp8)->layer(1).w13[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*fp8)->embed().dtype, DType::kF32);
}

// --quantization fp8 on an f32 checkpoint computes exactly the model whose weights are the FP8
// values: each linear weight quantized by 128 x 128 blocks as an FP8 checkpoint's writer does
// (before MLA's derivations), the embedding and lm_head kept in bf16. The oracle is the f32
// model loaded from those values.
TEST(DeepseekModelTest, QuantizingAtLoadComputesTheDequantizedModel) {
  const std::string dir = Fixture("hf/deepseekv3");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  CpuBackend backend(CpuBackendOptions{CpuPath::kFast, 1, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
  auto w = ModelWeights::Load(*config, **checkpoint, &backend, DType::kF8E4M3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layer(1).q_nope.dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->layer(1).k_up_t[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->layer(1).w13[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*w)->embed().dtype, DType::kBF16);
  PatchedSource dequantized(**checkpoint);
  int64_t quantized = 0;
  for (const std::string& name : (*checkpoint)->Names()) {
    const TensorView* t = (*checkpoint)->Find(name);
    auto m = ReadHostMatrix(*t, nullptr);
    ASSERT_TRUE(m.ok());
    std::vector<float> values = m->values;
    const bool table = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    if (table) {
      for (float& v : values) v = Bf16ToF32(F32ToBf16(v));
    } else if (t->shape.size() == 2 && name.find("mlp.gate.weight") == std::string::npos) {
      const HostMatrix q = QuantizeFp8(*m);
      for (int64_t i = 0; i < q.rows * q.cols; ++i) {
        values[i] = F8E4M3ToF32(q.bytes[i]) * q.scales[(i / q.cols) * q.ScaleGroups() + (i % q.cols) / 128];
      }
      ++quantized;
    }
    dequantized.Set(name, t->shape, values);
  }
  EXPECT_GT(quantized, 20);
  const double err = LogitError(*config, dequantized, dir, DType::kF32, &*w);
  EXPECT_LT(err, 2e-5) << "max-abs logit error " << err;
}

// The fastest kernel variant (on a CPU with AVX512-BF16 it rounds the activations of FP8
// products to bf16) stays within bf16's precision of transformers' logits.
TEST(Fp8CheckpointTest, TheFastestVariantStaysWithinBf16OfTransformers) {
  const std::string dir = Fixture("hf/deepseekv3fp8");
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  CpuBackend fastest(CpuBackendOptions{CpuPath::kFast, 2, 0});
  auto weights = ModelWeights::Load(*config, **checkpoint, &fastest, DType::kF32);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const nlohmann::json expected = checkpoint_test::ReadJson(dir + "/expected.json");
  const auto ids = expected["cases"][0]["ids"].get<std::vector<int32_t>>();
  const std::vector<float> got = checkpoint_test::PrefillLogits(*config, **weights, &fastest, ids);
  std::ifstream f(dir + "/" + expected["cases"][0]["logits"].get<std::string>(), std::ios::binary);
  std::vector<float> want(got.size());
  f.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(float)));
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double{got[i]} - want[i]));
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
  }
  std::printf("%s: max-abs logit error %.3g (relative %.3g)\n", CpuIsaName(fastest.isa()), max_err, max_err / max_ref);
  // bf16 keeps 8 significant bits (relative 2^-9 per value); over a few layers of sums 2%.
  EXPECT_LT(max_err, 0.02 * max_ref) << "max-abs " << max_err << " (relative " << max_err / max_ref << ")";
}

}  // namespace
}  // namespace moeserve