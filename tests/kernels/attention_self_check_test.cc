// The attention half of the kernel variants' self-check (kernels/cpu/attention_self_check.h):
// every variant this CPU runs passes it, and kernels that are wrong in the ways a variant could be
// (an output off by more than 50x its bound, scores 5% off, a NaN, the wrong layer, a token that
// depends on its batch mates) fail it, naming what failed.
#include "kernels/cpu/attention_self_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/kernel_select.h"

namespace moeserve {
namespace {

using cpu_fast::AttentionCheckErrors;
using cpu_fast::LatentAttentionFn;
using cpu_fast::PagedAttentionFn;

constexpr CpuIsa kVariants[] = {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx, CpuIsa::kAmxModel};

class AttentionSelfCheckTest : public ::testing::Test {
 protected:
  std::string Seed() const { return "seed " + std::to_string(seed_); }
  const uint32_t seed_ = std::random_device{}();
  std::mt19937 gen_{seed_};
  ThreadPool pool_{2};
  // The exact kernel (every CPU has it), or the bf16 one where this CPU runs it.
  cpu_fast::AttentionKernel Kernel() const {
    return DetectCpuFeatures().avx512_bf16 ? cpu_fast::AttentionKernel::kBf16Dot : cpu_fast::AttentionKernel::kExact;
  }
  // Whether that kernel rounds queries and probabilities over a cache of `dtype`.
  bool Bf16(DType dtype) const { return dtype == DType::kBF16 && Kernel() != cpu_fast::AttentionKernel::kExact; }
  PagedAttentionFn Real() {
    return [this](const float* q, const AttentionBatch& b, const KvLayout& l, int64_t layer, const void* cache,
                  int64_t q_heads, float scale, float* out) {
      cpu_fast::PagedAttention(pool_, q, b, l, layer, cache, q_heads, scale, out, Kernel());
    };
  }
  LatentAttentionFn RealLatent() {
    return [this](const float* ql, const float* qr, const AttentionBatch& b, const KvLayout& l, int64_t layer,
                  const void* cache, int64_t heads, int64_t latent, float scale, float* out) {
      cpu_fast::PagedLatentAttention(pool_, ql, qr, b, l, layer, cache, heads, latent, scale, out, Kernel());
    };
  }
};

TEST_F(AttentionSelfCheckTest, EveryVariantThisCpuRunsPasses) {
  SCOPED_TRACE(Seed());
  for (CpuIsa isa : kVariants) {
    std::string missing;
    if (!CpuSupports(DetectCpuFeatures(), isa, &missing)) continue;
    if (isa == CpuIsa::kAmx) continue;  // tiles are granted per process: SelfCheckVariant runs it in a child
    AttentionCheckErrors errors;
    EXPECT_EQ(cpu_fast::CheckAttentionKernels(isa, pool_, gen_, &errors), "") << CpuIsaName(isa);
    EXPECT_GT(errors.paged, 0.0) << CpuIsaName(isa) << ": nothing was compared";
    EXPECT_GT(errors.latent, 0.0) << CpuIsaName(isa) << ": nothing was compared";
    EXPECT_LE(errors.paged, 1.0);
    EXPECT_LE(errors.latent, 1.0);
  }
  for (const VariantCheck& v : CheckedVariants()) {
    if (v.passed) EXPECT_NE(v.detail.find("(attention)"), std::string::npos) << v.detail;
  }
}

TEST_F(AttentionSelfCheckTest, AnOutputOffByMoreThanItsRoundingFails) {
  SCOPED_TRACE(Seed());
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const PagedAttentionFn real = Real();
    const PagedAttentionFn off = [&](const float* q, const AttentionBatch& b, const KvLayout& l, int64_t layer,
                                     const void* cache, int64_t q_heads, float scale, float* out) {
      real(q, b, l, layer, cache, q_heads, scale, out);
      if (b.num_tokens > 1) out[(b.num_tokens - 1) * q_heads * l.head_dim + 5] += 0.25f;  // the last token's
    };
    AttentionCheckErrors errors;
    const std::string e = cpu_fast::CheckPagedAttention(off, dtype, Bf16(dtype), gen_, &errors);
    EXPECT_NE(e.find("of its bound"), std::string::npos) << e;
    EXPECT_GT(errors.paged, 1.0);
    AttentionCheckErrors fine;
    EXPECT_EQ(cpu_fast::CheckPagedAttention(real, dtype, Bf16(dtype), gen_, &fine), "");
  }
}

// The bound is tight enough that scores a few percent off fail it (a bound on max |v| let 10%
// through: random contexts average such an error away in the output).
TEST_F(AttentionSelfCheckTest, ScoresAFewPercentOffFail) {
  SCOPED_TRACE(Seed());
  const PagedAttentionFn real = Real();
  const PagedAttentionFn scaled = [&](const float* q, const AttentionBatch& b, const KvLayout& l, int64_t layer,
                                      const void* cache, int64_t q_heads, float scale, float* out) {
    real(q, b, l, layer, cache, q_heads, scale * 1.05f, out);
  };
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    AttentionCheckErrors errors;
    const std::string e = cpu_fast::CheckPagedAttention(scaled, dtype, Bf16(dtype), gen_, &errors);
    EXPECT_NE(e.find("of its bound"), std::string::npos) << DTypeShortName(dtype) << ": " << e;
  }
  const LatentAttentionFn latent = RealLatent();
  const LatentAttentionFn latent_scaled = [&](const float* ql, const float* qr, const AttentionBatch& b,
                                              const KvLayout& l, int64_t layer, const void* cache, int64_t heads,
                                              int64_t dim, float scale, float* out) {
    latent(ql, qr, b, l, layer, cache, heads, dim, scale * 1.05f, out);
  };
  AttentionCheckErrors errors;
  const std::string e = cpu_fast::CheckLatentAttention(latent_scaled, DType::kBF16, Bf16(DType::kBF16), gen_, &errors);
  EXPECT_NE(e.find("of its bound"), std::string::npos) << e;
}

TEST_F(AttentionSelfCheckTest, ANanOrTheWrongLayerFails) {
  SCOPED_TRACE(Seed());
  const PagedAttentionFn real = Real();
  const PagedAttentionFn nan = [&](const float* q, const AttentionBatch& b, const KvLayout& l, int64_t layer,
                                   const void* cache, int64_t q_heads, float scale, float* out) {
    real(q, b, l, layer, cache, q_heads, scale, out);
    out[0] = std::numeric_limits<float>::quiet_NaN();
  };
  const PagedAttentionFn other_layer = [&](const float* q, const AttentionBatch& b, const KvLayout& l, int64_t layer,
                                           const void* cache, int64_t q_heads, float scale, float* out) {
    real(q, b, l, 1 - layer, cache, q_heads, scale, out);
  };
  for (const PagedAttentionFn& wrong : {nan, other_layer}) {
    AttentionCheckErrors errors;
    const std::string e = cpu_fast::CheckPagedAttention(wrong, DType::kBF16, Bf16(DType::kBF16), gen_, &errors);
    EXPECT_NE(e.find("of its bound"), std::string::npos) << e;
  }
}

TEST_F(AttentionSelfCheckTest, AResultThatDependsOnTheBatchFails) {
  SCOPED_TRACE(Seed());
  const PagedAttentionFn real = Real();
  // Within the bound, but a token's bits change with its batch mates.
  const PagedAttentionFn batch_dependent = [&](const float* q, const AttentionBatch& b, const KvLayout& l,
                                               int64_t layer, const void* cache, int64_t q_heads, float scale,
                                               float* out) {
    real(q, b, l, layer, cache, q_heads, scale, out);
    if (b.num_tokens > 1) out[3] = std::nextafter(out[3], INFINITY);
  };
  AttentionCheckErrors errors;
  const std::string e = cpu_fast::CheckPagedAttention(batch_dependent, DType::kBF16, Bf16(DType::kBF16), gen_, &errors);
  EXPECT_NE(e.find("not batch-invariant"), std::string::npos) << e;
  EXPECT_LE(errors.paged, 1.0);
}

TEST_F(AttentionSelfCheckTest, WrongLatentAttentionFails) {
  SCOPED_TRACE(Seed());
  const LatentAttentionFn real = RealLatent();
  AttentionCheckErrors fine;
  EXPECT_EQ(cpu_fast::CheckLatentAttention(real, DType::kBF16, Bf16(DType::kBF16), gen_, &fine), "");
  EXPECT_GT(fine.latent, 0.0);
  const LatentAttentionFn off = [&](const float* ql, const float* qr, const AttentionBatch& b, const KvLayout& l,
                                    int64_t layer, const void* cache, int64_t heads, int64_t latent, float scale,
                                    float* out) {
    real(ql, qr, b, l, layer, cache, heads, latent, scale, out);
    out[latent - 1] -= 0.25f;  // the first token's first head, its last latent dimension
  };
  AttentionCheckErrors errors;
  const std::string e = cpu_fast::CheckLatentAttention(off, DType::kBF16, Bf16(DType::kBF16), gen_, &errors);
  EXPECT_NE(e.find("latent attention over a bf16 cache"), std::string::npos) << e;
  EXPECT_GT(errors.latent, 1.0);
}

}  // namespace
}  // namespace moeserve
