// The whole model: logits of the engine's forward (fast and reference CPU paths, paged KV,
// chunked prefill) against an independent naive forward with double accumulation, for the
// prefill and every decode step; batched paged decode against each sequence alone; determinism.
#include <random>
#include <set>

#include "tests/engine/generator.h"
#include "engine/sampling.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/moe_model.h"
#include "text/tokenizer.h"
#include "models/weight_init.h"
#include "tests/models/naive_forward.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::AllClose;

struct Variant {
  std::string name;
  ModelConfig config;
  DType weight_dtype;
  DType kv_dtype;
  double tol;
};

ModelConfig Tiny() { return *PresetConfig("tiny"); }

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  v.push_back({"f32", Tiny(), DType::kF32, DType::kF32, 2e-4});
  v.push_back({"bf16_weights", Tiny(), DType::kBF16, DType::kF32, 2e-4});
  v.push_back({"bf16_kv", Tiny(), DType::kF32, DType::kBF16, 2e-2});
  ModelConfig shared = Tiny();
  shared.shared_expert_intermediate_size = 40;
  shared.tie_word_embeddings = true;
  shared.norm_topk_prob = false;
  shared.num_local_experts = 5;
  shared.num_experts_per_tok = 3;
  shared.num_key_value_heads = 1;
  v.push_back({"shared_expert_tied_mqa", shared, DType::kF32, DType::kF32, 2e-4});
  return v;
}

// Runs `requests` through a Generator on `backend` and returns results with logits.
std::vector<GenerationResult> Generate(const ModelWeights& weights, Backend* backend, DType kv_dtype,
                                       const std::vector<GenerationRequest>& requests,
                                       int64_t prefill_chunk, int64_t block_size = 4) {
  const ModelConfig& c = weights.config();
  auto kv = KvStorage::Create(backend, KvLayoutFor(c, 128, block_size, kv_dtype));
  EXPECT_TRUE(kv.ok()) << kv.status();
  BlockPool pool(128);
  MoeModel model(&weights, backend);
  Generator gen(&model, &*kv, &pool, GeneratorOptions{prefill_chunk, /*keep_logits=*/true});
  auto results = gen.Run(requests);
  EXPECT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(pool.num_free(), pool.num_blocks()) << "blocks leaked";
  EXPECT_TRUE(pool.CheckInvariants());
  return results.ok() ? *results : std::vector<GenerationResult>{};
}

std::vector<int32_t> RandomPrompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(gen);
  return p;
}

class ModelVsNaiveTest : public ::testing::TestWithParam<std::tuple<int, CpuPath>> {};

TEST_P(ModelVsNaiveTest, PrefillAndEveryDecodeStepMatchNaiveForward) {
  const Variant v = Variants()[std::get<0>(GetParam())];
  SCOPED_TRACE(v.name);
  auto tensors = GenerateRandomWeights(v.config, 1234, DType::kF32);
  // The exact kernels (fp32 activations), as the naive forward computes; the variants that round
  // activations to bf16 are checked against their own bound in tests/kernels.
  CpuBackend backend(CpuBackendOptions{std::get<1>(GetParam()), 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact});
  auto weights = ModelWeights::Load(v.config, *tensors, &backend, v.weight_dtype);
  ASSERT_TRUE(weights.ok()) << weights.status();

  GenerationRequest req;
  req.prompt = RandomPrompt(23, v.config.vocab_size, 99);
  req.max_tokens = 12;
  // Prefill in chunks of 7 tokens, blocks of 4: chunk and block boundaries differ.
  auto results = Generate(**weights, &backend, v.kv_dtype, {req}, 7);
  ASSERT_EQ(results.size(), 1u);
  const auto& r = results[0];
  ASSERT_EQ(r.tokens.size(), 12u);

  std::vector<int32_t> seq = req.prompt;
  seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
  testing::NaiveMixtral naive(v.config, *tensors, v.weight_dtype == DType::kBF16, v.kv_dtype == DType::kBF16);
  auto expected = naive.Logits(seq);
  for (size_t step = 0; step < r.tokens.size(); ++step) {
    const auto& want = expected[req.prompt.size() - 1 + step];
    std::vector<float> want_f(want.begin(), want.end());
    EXPECT_TRUE(AllClose(r.logits[step], want_f, v.tol, v.tol))
        << (step == 0 ? "prefill" : "decode step " + std::to_string(step));
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ModelVsNaiveTest,
                         ::testing::Combine(::testing::Range(0, 4),
                                            ::testing::Values(CpuPath::kFast, CpuPath::kReference)),
                         [](const auto& info) {
                           return Variants()[std::get<0>(info.param)].name +
                                  (std::get<1>(info.param) == CpuPath::kFast ? "_fast" : "_reference");
                         });

TEST(ModelTest, BatchedPagedDecodeEqualsEachSequenceAlone) {
  const ModelConfig c = Tiny();
  auto tensors = GenerateRandomWeights(c, 77, DType::kF32);
  CpuBackend backend;
  auto weights = ModelWeights::Load(c, *tensors, &backend, DType::kBF16);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::vector<int64_t> prompt_lens = {1, 5, 16, 17, 33, 8};
  const std::vector<int32_t> max_tokens = {10, 3, 12, 7, 9, 1};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    GenerationRequest r;
    r.prompt = RandomPrompt(prompt_lens[i], c.vocab_size, 500 + i);
    r.max_tokens = max_tokens[i];
    reqs.push_back(r);
  }
  auto together = Generate(**weights, &backend, DType::kF32, reqs, 20);
  ASSERT_EQ(together.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = Generate(**weights, &backend, DType::kF32, {reqs[i]}, 512, 16);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "request " << i;
    ASSERT_EQ(together[i].logits.size(), alone[0].logits.size());
    for (size_t s = 0; s < alone[0].logits.size(); ++s) {
      EXPECT_TRUE(AllClose(together[i].logits[s], alone[0].logits[s], 1e-4, 1e-4)) << "request " << i << " step " << s;
    }
  }
}

// A tensor the config does not explain (a bias, another architecture's part) is refused by name:
// loading past it would compute a different model than the checkpoint means.
TEST(ModelTest, ACheckpointWithATensorTheModelDoesNotUseIsRefused) {
  const ModelConfig config = *PresetConfig("tiny");
  auto tensors = GenerateRandomWeights(config, 3, DType::kF32);
  tensors->Add("model.layers.0.self_attn.q_proj.bias", DType::kF32, {config.q_dim()});
  CpuBackend backend(CpuBackendOptions{CpuPath::kReference});
  auto w = ModelWeights::Load(config, *tensors, &backend, DType::kF32);
  ASSERT_FALSE(w.ok()) << "loaded a checkpoint with an unused tensor";
  EXPECT_NE(std::string(w.status().message()).find("model.layers.0.self_attn.q_proj.bias"), std::string::npos)
      << w.status();
  EXPECT_EQ(backend.used_bytes(), 0u);
}

TEST(ModelTest, SeededWeightsAreDeterministic) {
  const ModelConfig c = Tiny();
  auto a = GenerateRandomWeights(c, 5, DType::kBF16);
  ThreadPool pool(2);
  auto b = GenerateRandomWeights(c, 5, DType::kBF16, &pool);
  auto d = GenerateRandomWeights(c, 6, DType::kBF16);
  int differing = 0;
  for (const auto& name : a->Names()) {
    const TensorView* ta = a->Find(name);
    const TensorView* tb = b->Find(name);
    ASSERT_EQ(ta->bytes, tb->bytes);
    EXPECT_EQ(0, std::memcmp(ta->data, tb->data, ta->bytes)) << name;
    differing += std::memcmp(ta->data, d->Find(name)->data, ta->bytes) != 0;
  }
  EXPECT_GT(differing, 0) << "a different seed must give different weights";
}

TEST(ModelTest, SeededSamplingIsReproducibleAndGreedyDoesNotCollapse) {
  const ModelConfig c = Tiny();
  auto tensors = GenerateRandomWeights(c, 0, DType::kF32);
  CpuBackend backend;
  auto weights = ModelWeights::Load(c, *tensors, &backend, DType::kF32);
  ASSERT_TRUE(weights.ok());
  GenerationRequest sampled;
  sampled.prompt = RandomPrompt(9, c.vocab_size, 1);
  sampled.max_tokens = 24;
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 42;
  GenerationRequest mate = sampled;
  mate.prompt = RandomPrompt(14, c.vocab_size, 2);
  mate.sampling.seed = 7;
  auto alone = Generate(**weights, &backend, DType::kF32, {sampled}, 512);
  auto again = Generate(**weights, &backend, DType::kF32, {mate, sampled}, 512);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(alone[0].tokens, again[1].tokens) << "a seeded request must not depend on its batch mates";

  GenerationRequest greedy;
  greedy.prompt = ByteTokenizer::Bytes("Hello, world", true);
  greedy.max_tokens = 48;
  auto g = Generate(**weights, &backend, DType::kF32, {greedy}, 512);
  std::set<int32_t> distinct(g[0].tokens.begin(), g[0].tokens.end());
  EXPECT_GE(distinct.size(), 8u) << "greedy decoding collapsed onto few tokens";
}

TEST(ModelTest, ForwardRejectsBadInput) {
  const ModelConfig c = Tiny();
  auto tensors = GenerateRandomWeights(c, 0, DType::kF32);
  CpuBackend backend;
  auto weights = ModelWeights::Load(c, *tensors, &backend, DType::kF32);
  ASSERT_TRUE(weights.ok());
  auto kv = KvStorage::Create(&backend, KvLayoutFor(c, 4, 16, DType::kF32));
  ASSERT_TRUE(kv.ok());
  MoeModel model(weights->get(), &backend);
  ForwardInput in;
  in.token_ids = {1, static_cast<int32_t>(c.vocab_size)};
  in.positions = {0, 1};
  in.token_seq = {0, 0};
  in.slots = {0, 1};
  in.block_tables = {0};
  in.num_seqs = 1;
  in.max_blocks_per_seq = 1;
  std::vector<float> logits;
  absl::Status s = model.Forward(in, kv->layout(), kv->data(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("vocabulary"), std::string::npos) << s;
  in.token_ids[1] = 2;
  in.block_tables = {4};
  s = model.Forward(in, kv->layout(), kv->data(), &logits);
  EXPECT_NE(std::string(s.message()).find("block id 4"), std::string::npos) << s;
  in.block_tables = {0};
  in.logit_rows = {1};
  EXPECT_TRUE(model.Forward(in, kv->layout(), kv->data(), &logits).ok());
  EXPECT_EQ(logits.size(), static_cast<size_t>(c.vocab_size));
  // Sampling specs: one per logit row, each within its range, and somewhere to put tokens.
  std::vector<int32_t> sampled;
  in.sample = {SampleSpec{}, SampleSpec{}};
  s = model.Forward(in, kv->layout(), kv->data(), &logits, nullptr, &sampled);
  EXPECT_NE(std::string(s.message()).find("2 specs for 1 logit rows"), std::string::npos) << s;
  in.sample = {SampleSpec{}};
  in.sample[0].u = 1.0;
  in.sample[0].temperature = 1.0f;
  s = model.Forward(in, kv->layout(), kv->data(), &logits, nullptr, &sampled);
  EXPECT_NE(std::string(s.message()).find("u 1 ([0, 1))"), std::string::npos) << s;
  in.sample[0].u = 0.5;
  s = model.Forward(in, kv->layout(), kv->data(), &logits, nullptr, nullptr);
  EXPECT_NE(std::string(s.message()).find("nowhere to put the tokens"), std::string::npos) << s;
}

// Sampling inside the forward (the engine's path): the tokens equal the host sampler's on the
// logits of the same step, and without logits_to_host no logits come back.
TEST(ModelTest, DeviceSamplingEqualsTheHostSamplerOnTheSameLogits) {
  const ModelConfig c = Tiny();
  const uint32_t seed = std::random_device{}();
  CpuBackend backend;
  auto weights = ModelWeights::Load(c, *GenerateRandomWeights(c, seed, DType::kF32), &backend, DType::kF32);
  ASSERT_TRUE(weights.ok());
  auto kv = KvStorage::Create(&backend, KvLayoutFor(c, 8, 16, DType::kF32));
  ASSERT_TRUE(kv.ok());
  MoeModel model(weights->get(), &backend);
  std::mt19937 gen(seed);
  ForwardInput in;
  in.num_seqs = 4;
  in.max_blocks_per_seq = 1;
  for (int j = 0; j < 4; ++j) {
    in.block_tables.push_back(j);
    for (int p = 0; p < 5; ++p) {
      in.token_ids.push_back(static_cast<int32_t>(gen() % c.vocab_size));
      in.positions.push_back(p);
      in.token_seq.push_back(j);
      in.slots.push_back(j * 16 + p);
    }
    in.logit_rows.push_back(j * 5 + 4);
  }
  std::vector<float> logits;
  ASSERT_TRUE(model.Forward(in, kv->layout(), kv->data(), &logits).ok());
  // Greedy, plain temperature, top-k, top-p, and min-p (the fourth field once was the seed: min_p
  // 1-4 made every row greedy).
  auto P = [](float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed) {
    SamplingParams s;
    s.temperature = temperature, s.top_k = top_k, s.top_p = top_p, s.min_p = min_p, s.seed = seed;
    return s;
  };
  const SamplingParams params[] = {P(0.0f, 0, 1.0f, 0.0f, 1), P(0.8f, 0, 1.0f, 0.0f, 2), P(1.0f, 5, 1.0f, 0.0f, 3),
                                   P(1.5f, 0, 0.6f, 0.05f, 4)};
  std::vector<Sampler> host, device;
  for (const auto& p : params) {
    host.emplace_back(p, 0);
    device.emplace_back(p, 0);
  }
  for (int draw = 0; draw < 20; ++draw) {  // the same step, fresh uniform draws each time
    in.sample.clear();
    for (auto& d : device) in.sample.push_back(d.Next());
    in.logits_to_host = false;
    std::vector<float> none;
    std::vector<int32_t> sampled;
    ASSERT_TRUE(model.Forward(in, kv->layout(), kv->data(), &none, nullptr, &sampled).ok());
    EXPECT_TRUE(none.empty());
    ASSERT_EQ(sampled.size(), 4u);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(sampled[j], host[j].Sample(logits.data() + j * c.vocab_size, c.vocab_size))
          << "row " << j << " draw " << draw << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace moeserve
