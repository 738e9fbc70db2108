// Long-prompt TTFT per KV tier.
#include "tools/bench_tiers.h"

#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/progress.h"
#include "core/status.h"

namespace moeserve::tools {
namespace {

struct Run {
  double ttft = 0;
  RequestUsage usage;
};

absl::StatusOr<Run> RunOne(Engine* engine, const std::vector<int32_t>& prompt) {
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = 1;
  Run r;
  ASSIGN_OR_RETURN(uint64_t id, engine->Submit(g, [&](const RequestEvent& ev) {
    if (!ev.finished) return;
    r.ttft = ev.timing.ttft_seconds;
    r.usage = ev.usage;
  }));
  (void)id;
  RETURN_IF_ERROR(engine->RunUntilIdle());
  return r;
}

// The scenario's prompt and the three fillers that push it out of the device pool.
struct Prompts {
  std::vector<int32_t> prompt, filler_a, filler_b, filler_c;
};

// A fresh private directory of its own (inside --flash-kv-dir when given: the disk to measure),
// so the scenario never touches records or the lock of a server using that directory.
absl::StatusOr<std::string> ScenarioFlashDir(const TierScenarioOptions& o) {
  const std::string parent = o.flash_dir.empty() ? std::filesystem::temp_directory_path().string() : o.flash_dir;
  std::error_code mk_ec;
  std::filesystem::create_directories(parent, mk_ec);
  std::string tmpl = absl::StrCat(parent, "/moeserve_tier_scenario_XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--flash-kv-dir: cannot create a directory in ", parent, ": ",
                                                   std::strerror(errno)));
  }
  return tmpl;
}

// Runs the prompt cold, then from the device, then (after the fillers) from the lower tier;
// without `runs` (the flash engine), only the last is kept.
absl::Status PlayScenario(Engine* engine, const Prompts& p, Progress* progress, int64_t* step, bool flush,
                          std::vector<Run>* runs) {
  progress->Update(*step, "cold prefill");
  ASSIGN_OR_RETURN(Run cold, RunOne(engine, p.prompt));
  runs->push_back(cold);
  if (!flush) {
    progress->Update(++*step, "device hit");
    ASSIGN_OR_RETURN(Run device, RunOne(engine, p.prompt));
    runs->push_back(device);
  }
  progress->Update(++*step, "evicting");
  RETURN_IF_ERROR(RunOne(engine, p.filler_a).status());
  progress->Update(++*step, "evicting");
  RETURN_IF_ERROR(RunOne(engine, p.filler_b).status());
  RETURN_IF_ERROR(RunOne(engine, p.filler_c).status());
  if (flush) engine->WaitForTransfers();  // the transfer thread has written the evicted blocks
  progress->Update(++*step, flush ? "flash hit" : "DDR hit");
  ASSIGN_OR_RETURN(Run hit, RunOne(engine, p.prompt));
  runs->push_back(hit);
  return absl::OkStatus();
}

nlohmann::json RunJson(const Run& r) {
  return {{"ttft_s", r.ttft},
          {"cached_tokens", r.usage.cached_prompt_tokens},
          {"cached_tokens_ddr", r.usage.cached_prompt_tokens_ddr},
          {"cached_tokens_flash", r.usage.cached_prompt_tokens_flash}};
}

// The tiers' copy bandwidths as the engines measured them.
nlohmann::json MeasuredJson(const KvTierStats& ddr, const KvTierStats& flash, uint64_t block_bytes) {
  auto bandwidth = [&](int64_t blocks, double seconds) {
    return seconds > 0 ? static_cast<double>(blocks) * static_cast<double>(block_bytes) / seconds : 0.0;
  };
  return {{"demote_to_ddr_bytes_per_s", bandwidth(ddr.demoted, ddr.demote_seconds)},
          {"promote_from_ddr_bytes_per_s", bandwidth(ddr.promoted_ddr, ddr.promote_ddr_seconds)},
          {"demote_to_flash_bytes_per_s", bandwidth(flash.host.demoted_to_flash, flash.host.flash_write_seconds)},
          {"promote_from_flash_bytes_per_s", bandwidth(flash.promoted_flash, flash.promote_flash_seconds)}};
}

void PrintScenario(const nlohmann::json& j, const std::vector<std::pair<const char*, const Run*>>& rows,
                   const std::optional<roofline::HardwareProfile>& hw) {
  std::printf("tier scenario: one %lld-token prompt, TTFT by where its prefix comes from\n",
              static_cast<long long>(j["prompt_tokens"].get<int64_t>()));
  for (auto [name, r] : rows) {
    std::printf("  %-16s TTFT %9.2f ms  cached %5lld tokens (DDR %lld, flash %lld)\n", name, r->ttft * 1e3,
                static_cast<long long>(r->usage.cached_prompt_tokens),
                static_cast<long long>(r->usage.cached_prompt_tokens_ddr),
                static_cast<long long>(r->usage.cached_prompt_tokens_flash));
  }
  const auto& m = j["measured"];
  std::printf("  copies: to DDR %.2f GB/s, from DDR %.2f GB/s, to flash %.2f GB/s, from flash %.2f GB/s\n",
              m["demote_to_ddr_bytes_per_s"].get<double>() / 1e9, m["promote_from_ddr_bytes_per_s"].get<double>() / 1e9,
              m["demote_to_flash_bytes_per_s"].get<double>() / 1e9,
              m["promote_from_flash_bytes_per_s"].get<double>() / 1e9);
  if (hw) {
    std::printf("  profile %s: host link %.2f GB/s, disk read %.2f GB/s, disk write %.2f GB/s\n", hw->name.c_str(),
                hw->host_link_bandwidth / 1e9, hw->disk_read_bandwidth / 1e9, hw->disk_write_bandwidth / 1e9);
  }
}

}  // namespace

absl::StatusOr<nlohmann::json> RunTierScenario(const EngineConfig& base, const ModelWeights* weights,
                                               Backend* backend, const TierScenarioOptions& o,
                                               const std::optional<roofline::HardwareProfile>& hw) {
  const ModelConfig& c = weights->config();
  if (o.prompt_tokens < 2 * base.block_size || o.prompt_tokens + 1 >= c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--tier-prompt must be in [", 2 * base.block_size, ", ",
                                                   c.max_position_embeddings - 2, "], got ", o.prompt_tokens));
  }
  std::mt19937 gen(2026);
  auto random_prompt = [&] {
    std::vector<int32_t> p(static_cast<size_t>(o.prompt_tokens));
    for (auto& t : p) t = static_cast<int32_t>(gen() % 256);
    return p;
  };
  Prompts prompts;
  prompts.prompt = random_prompt();
  prompts.filler_a = random_prompt();
  prompts.filler_b = random_prompt();
  prompts.filler_c = random_prompt();
  const int64_t prompt_blocks = (o.prompt_tokens + 1 + base.block_size - 1) / base.block_size;
  ASSIGN_OR_RETURN(const std::string flash_dir, ScenarioFlashDir(o));
  // Room on the device for the prompt and one filler: the second and third fillers evict all of
  // the prompt's blocks.
  EngineConfig ec = base;
  ec.num_kv_blocks = 2 * prompt_blocks + 2;
  ec.scheduler.prefix_caching = true;
  const uint64_t block_bytes = KvLayoutFor(c, 1, base.block_size, base.kv_dtype).BlockBytes();
  Progress progress("tier scenario", 9, o.progress);
  int64_t step = 0;
  // 1. DDR: cold, device hit, then evicted to DDR and brought back.
  ec.kv_tiers = {};
  ec.kv_tiers.host_bytes = 2 * prompt_blocks * block_bytes;
  std::vector<Run> ddr_runs, flash_runs;
  ASSIGN_OR_RETURN(auto ddr_engine, Engine::Create(ec, weights, backend));
  RETURN_IF_ERROR(PlayScenario(ddr_engine.get(), prompts, &progress, &step, /*flush=*/false, &ddr_runs));
  const KvTierStats ddr_stats = ddr_engine->GetStats().tiers;
  ddr_engine.reset();
  // 2. Flash only: evicted straight to flash and brought back from it.
  ec.kv_tiers = {};
  ec.kv_tiers.flash_dir = flash_dir;
  ec.kv_tiers.flash_bytes = 4 * prompt_blocks * (block_bytes + 4096);
  ASSIGN_OR_RETURN(auto flash_engine, Engine::Create(ec, weights, backend));
  ++step;
  RETURN_IF_ERROR(PlayScenario(flash_engine.get(), prompts, &progress, &step, /*flush=*/true, &flash_runs));
  const KvTierStats flash_stats = flash_engine->GetStats().tiers;
  flash_engine.reset();
  std::filesystem::remove_all(flash_dir);
  progress.Finish(++step, "done");

  const Run &cold = ddr_runs[0], &device = ddr_runs[1], &ddr = ddr_runs[2], &flash = flash_runs[1];
  nlohmann::json j;
  j["prompt_tokens"] = o.prompt_tokens;
  j["block_bytes"] = block_bytes;
  j["kv_bytes_of_prompt"] = static_cast<double>(o.prompt_tokens / base.block_size) * static_cast<double>(block_bytes);
  j["cold"] = RunJson(cold);
  j["device_hit"] = RunJson(device);
  j["ddr_hit"] = RunJson(ddr);
  j["flash_hit"] = RunJson(flash);
  j["measured"] = MeasuredJson(ddr_stats, flash_stats, block_bytes);
  if (hw) {
    j["profile"] = {{"name", hw->name},
                    {"host_link_bytes_per_s", hw->host_link_bandwidth},
                    {"disk_read_bytes_per_s", hw->disk_read_bandwidth},
                    {"disk_write_bytes_per_s", hw->disk_write_bandwidth}};
  }
  PrintScenario(j, {{"cold (computed)", &cold}, {"device hit", &device}, {"DDR hit", &ddr}, {"flash hit", &flash}}, hw);
  return j;
}

}  // namespace moeserve::tools
