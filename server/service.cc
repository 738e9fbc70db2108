// Service handlers.
#include "server/service.h"

#include "absl/strings/str_cat.h"
#include "server/generate_reactor.h"
#include "server/step_summary.h"
#include "server/wire.h"

namespace moeserve::server {

MoeserveService::MoeserveService(Engine* engine, ServiceOptions options, DrainGate* gate, StreamEncoder* encoder)
    : engine_(engine), options_(std::move(options)), gate_(gate), encoder_(encoder) {}

absl::StatusOr<std::string> MoeserveService::Admit(grpc::CallbackServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  size_t bytes = 0;
  for (const auto& [key, value] : md) bytes += key.size() + value.size() + 32;
  if (bytes > options_.max_metadata_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("request metadata of ", bytes, " bytes exceeds the limit of ",
                                                     options_.max_metadata_bytes, " (--max-metadata-bytes)"));
  }
  auto it = md.find("authorization");
  std::optional<std::string> tenant;
  if (it == md.end()) {
    tenant = options_.api_keys.Authenticate(nullptr);
  } else {
    const absl::string_view value(it->second.data(), it->second.size());
    tenant = options_.api_keys.Authenticate(&value);
  }
  if (!tenant.has_value()) return absl::UnauthenticatedError(kUnauthenticatedMessage);
  return *std::move(tenant);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* MoeserveService::Generate(grpc::CallbackServerContext* ctx,
                                                                     const grpc::ByteBuffer* request) {
  return new GenerateReactor(engine_, ctx, *request, options_.limits, options_.tokenizer, Admit(ctx),
                             gate_, encoder_);
}

bool MoeserveService::AcceptUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  google::protobuf::Message* parsed, grpc::ServerUnaryReactor* reactor) const {
  if (auto tenant = Admit(ctx); !tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return false;
  }
  if (absl::Status s = ParseRequest(*request, parsed); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return false;
  }
  return true;
}

grpc::ServerUnaryReactor* MoeserveService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  auto* reactor = ctx->DefaultReactor();
  v1::GetModelInfoRequest parsed;
  if (!AcceptUnary(ctx, request, &parsed, reactor)) return reactor;
  v1::ModelInfo info = options_.model_info;
  info.set_parallel_layout(engine_->ParallelLayout());  // where --eplb-interval has moved the experts
  SerializeResponse(info, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void FillStats(const EngineStats& s, v1::Stats* out) {
  out->set_queue_depth(s.waiting);
  out->set_running_requests(s.running);
  const size_t keep = 64;
  const size_t from = s.recent_steps.size() > keep ? s.recent_steps.size() - keep : 0;
  for (size_t i = from; i < s.recent_steps.size(); ++i) {
    FillStepSummary(s.recent_steps[i], out->add_recent_steps());
  }
  out->set_kv_blocks_total(s.kv_blocks_total);
  out->set_kv_blocks_used(s.kv_blocks_used);
  out->set_kv_blocks_free(s.kv_blocks_free);
  out->set_kv_blocks_cached(s.kv_blocks_cached);
  out->set_prompt_tokens(s.prompt_tokens);
  out->set_cached_prompt_tokens(s.cached_prompt_tokens);
  out->set_generated_tokens(s.generated_tokens);
  out->set_prefix_hit_rate(s.prompt_tokens ? static_cast<double>(s.cached_prompt_tokens) / s.prompt_tokens : 0.0);
  out->set_steps(s.steps);
  out->set_preemptions(s.preemptions);
  out->set_swaps(s.swaps);
  out->set_kv_blocks_retained(s.kv_blocks_retained);
  out->set_uptime_seconds(s.uptime_seconds);
  out->set_backend(s.backend);
  out->set_kernel_numerics(s.kernel_numerics);
  if (s.has_tiers) {
    v1::KvTierStats* t = out->mutable_kv_tiers();
    t->set_ddr_capacity_blocks(s.tiers.host.capacity_blocks);
    t->set_ddr_blocks(s.tiers.host.blocks);
    t->set_flash_records(s.tiers.flash.records);
    t->set_flash_bytes(static_cast<int64_t>(s.tiers.flash.bytes));
    t->set_flash_budget_bytes(static_cast<int64_t>(s.tiers.flash.budget_bytes));
    t->set_demoted_blocks(s.tiers.demoted);
    t->set_promoted_from_ddr(s.tiers.promoted_ddr);
    t->set_promoted_from_flash(s.tiers.promoted_flash);
    t->set_flash_dropped(s.tiers.flash.dropped_corrupt + s.tiers.flash.dropped_foreign +
                         s.tiers.flash.dropped_truncated + s.tiers.flash.dropped_incomplete);
    t->set_ddr_to_flash(s.tiers.host.demoted_to_flash);
    t->set_ddr_retained(s.tiers.host.retained);
    t->set_flash_retained(s.tiers.flash.retained);
    t->set_ddr_swap_blocks(s.tiers.host.swap_blocks);
    t->set_swapped_out(s.tiers.swapped_out);
    t->set_swapped_in(s.tiers.swapped_in);
    t->set_swap_decisions(s.tiers.swap_decisions);
    t->set_recompute_decisions(s.tiers.recompute_decisions);
    t->set_prefetched_blocks(s.tiers.host.prefetched);
    t->set_pending_flash_writes(s.tiers.host.pending_writes);
    t->set_flash_skipped(s.tiers.flash.skipped_foreign + s.tiers.flash.skipped_other);
    t->set_promote_failures(s.tiers.promote_failures);
    t->set_swap_failures(s.tiers.swap_failures);
    t->set_demote_failures(s.tiers.demote_failures);
  }
  out->set_busy_seconds(s.busy_seconds);
  out->set_batched_seqs(s.batched_seqs);
  out->set_prefill_tokens(s.step_prefill_tokens);
  out->set_decode_tokens(s.step_decode_tokens);
  auto& m = *out->mutable_requests_by_outcome();
  m["length"] = s.finished_length;
  m["stop"] = s.finished_stop;
  m["cancelled"] = s.cancelled;
  m["deadline_exceeded"] = s.deadline_exceeded;
  m["error"] = s.errors;
  m["refused"] = s.refused;
}

grpc::ServerUnaryReactor* MoeserveService::GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  auto* reactor = ctx->DefaultReactor();
  v1::GetStatsRequest parsed;
  if (!AcceptUnary(ctx, request, &parsed, reactor)) return reactor;
  v1::Stats stats;
  FillStats(engine_->GetStats(), &stats);
  SerializeResponse(stats, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace moeserve::server
