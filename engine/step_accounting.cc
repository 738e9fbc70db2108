// Step records.
#include "engine/step_accounting.h"

namespace moeserve {

StepRecord AccountStep(const SchedulerOutput& out, const StepBatch& batch, const RunnerOutput& run,
                       const StepTiming& timing, const StepPricing& pricing) {
  StepRecord rec;
  rec.start_seconds = timing.start_seconds;
  rec.duration_seconds = timing.duration_seconds;
  rec.schedule_seconds = timing.schedule_seconds;
  rec.attention_seconds = run.stats.attention_seconds;
  rec.moe_seconds = run.stats.moe_seconds;
  rec.head_seconds = run.stats.head_seconds;
  rec.comm_seconds = run.stats.comm_seconds;
  rec.comm_min_seconds = run.parallel.comm_min_seconds;
  rec.comm_after_last_seconds = run.parallel.comm_after_last_seconds;
  rec.comm_bytes_observed = run.parallel.comm_bytes;
  rec.scale_out_bytes_observed = run.parallel.a2a_outside_bytes + run.parallel.pp_outside_bytes;
  rec.expert_imbalance = run.parallel.expert_imbalance;
  rec.expert_tokens = run.parallel.expert_tokens;
  rec.rank_imbalance = run.parallel.rank_imbalance;
  rec.attention_imbalance = run.parallel.attention_imbalance;
  rec.sampling_seconds = timing.duration_seconds - timing.forward_seconds;
  rec.transfer_seconds = timing.transfer_seconds;
  rec.transfer_bytes = timing.transfer_bytes;
  if (pricing.hardware != nullptr) {
    // The step's work from the cost model, and its prediction.
    roofline::StepShape shape;
    for (const auto& ch : out.chunks)
      shape.seqs.push_back({ch.num_tokens, ch.start + ch.num_tokens, ch.wants_logits});
    shape.experts_hit = static_cast<double>(run.stats.experts_hit);
    shape.transfer_bytes = timing.transfer_bytes;
    // With --ep, the step waited for its busiest rank: price that rank's share of the expert
    // weights and of their rows, as measured.
    shape.expert_rank_imbalance = run.parallel.rank_hit_imbalance;
    shape.expert_rows_imbalance = run.parallel.rank_imbalance;
    shape.attention_rank_imbalance = run.parallel.attention_imbalance;
    const roofline::StepCost cost = roofline::PredictStep(*pricing.costs, shape, *pricing.hardware,
                                                          pricing.layout, pricing.efficiency);
    rec.flops = cost.flops;
    rec.weight_bytes = cost.weight_bytes;
    rec.kv_read_bytes = cost.kv_read_bytes;
    rec.kv_write_bytes = cost.kv_write_bytes;
    rec.comm_bytes = cost.comm_bytes;
    rec.scale_out_bytes = cost.scale_out_bytes;
    rec.transfer_bytes = cost.transfer_bytes;
    rec.predicted_compute_seconds = cost.compute_seconds;
    rec.predicted_memory_seconds = cost.memory_seconds;
    rec.predicted_comm_seconds = cost.comm_seconds;
    rec.predicted_transfer_seconds = cost.transfer_seconds;
    rec.predicted_bound_seconds = cost.bound_seconds;
    rec.predicted_seconds = cost.seconds;
    if (pricing.layout.pp > 1) {  // the stages overlap the micro-batches: the pipeline's own time
      const roofline::PipelinedSeconds p =
          roofline::PipelinedStepSeconds(*pricing.costs, shape, *pricing.hardware, pricing.layout, pricing.efficiency);
      rec.predicted_bound_seconds = p.bound_seconds;
      rec.predicted_seconds = p.seconds;
    }
  }
  rec.num_seqs = batch.step.num_seqs;
  rec.num_tokens = out.num_tokens;
  rec.prefill_tokens = out.num_prefill_tokens;
  rec.decode_tokens = out.num_decode_tokens;
  rec.context_tokens = batch.context_tokens;
  rec.experts_hit = run.stats.experts_hit;
  rec.preempted = static_cast<int64_t>(out.preempted.size());
  return rec;
}

}  // namespace moeserve
