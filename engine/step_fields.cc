// The StepRecord fields that leave the engine (see step_fields.h).
#include "engine/step_fields.h"

namespace moeserve {

const std::vector<StepField>& StepFields() {
  using R = StepRecord;
  static const std::vector<StepField> fields = {
      {"", "step", "step", 1, &R::step},
      {"", "start_s", "", 1, &R::start_seconds},
      {"", "duration_s", "duration_ms", 1e3, &R::duration_seconds},
      {"", "num_seqs", "num_seqs", 1, &R::num_seqs},
      {"", "num_tokens", "num_tokens", 1, &R::num_tokens},
      {"", "prefill_tokens", "prefill_tokens", 1, &R::prefill_tokens},
      {"", "decode_tokens", "decode_tokens", 1, &R::decode_tokens},
      {"", "context_tokens", "", 1, &R::context_tokens},
      {"", "experts_hit", "experts_hit", 1, &R::experts_hit},
      {"", "preempted", "", 1, &R::preempted},
      {"observed_s", "schedule", "", 1, &R::schedule_seconds},
      {"observed_s", "attention", "attention_ms", 1e3, &R::attention_seconds},
      {"observed_s", "moe", "moe_ms", 1e3, &R::moe_seconds},
      {"observed_s", "head", "", 1, &R::head_seconds},
      {"observed_s", "sampling", "sampling_ms", 1e3, &R::sampling_seconds},
      {"observed_s", "comm", "comm_ms", 1e3, &R::comm_seconds},
      {"observed_s", "comm_min", "comm_min_ms", 1e3, &R::comm_min_seconds},
      {"observed_s", "comm_after_last", "comm_after_last_ms", 1e3, &R::comm_after_last_seconds},
      {"observed_s", "transfer", "transfer_ms", 1e3, &R::transfer_seconds},
      {"", "flops", "flops", 1, &R::flops},
      {"bytes", "weights", "weight_bytes", 1, &R::weight_bytes},
      {"bytes", "kv_read", "kv_read_bytes", 1, &R::kv_read_bytes},
      {"bytes", "kv_write", "", 1, &R::kv_write_bytes},
      {"bytes", "comm", "", 1, &R::comm_bytes},
      {"bytes", "comm_observed", "comm_bytes", 1, &R::comm_bytes_observed},
      {"bytes", "scale_out", "predicted_scale_out_bytes", 1, &R::scale_out_bytes},
      {"bytes", "scale_out_observed", "scale_out_bytes", 1, &R::scale_out_bytes_observed},
      {"bytes", "transfer", "transfer_bytes", 1, &R::transfer_bytes},
      {"", "expert_tokens", "expert_tokens", 1, &R::expert_tokens},
      {"", "expert_imbalance", "expert_imbalance", 1, &R::expert_imbalance},
      {"", "rank_imbalance", "rank_imbalance", 1, &R::rank_imbalance},
      {"", "attention_imbalance", "attention_imbalance", 1, &R::attention_imbalance},
      {"predicted_s", "compute", "", 1, &R::predicted_compute_seconds},
      {"predicted_s", "memory", "", 1, &R::predicted_memory_seconds},
      {"predicted_s", "comm", "predicted_comm_ms", 1e3, &R::predicted_comm_seconds},
      {"predicted_s", "transfer", "predicted_transfer_ms", 1e3, &R::predicted_transfer_seconds},
      {"predicted_s", "bound", "predicted_bound_ms", 1e3, &R::predicted_bound_seconds},
      {"predicted_s", "total", "predicted_ms", 1e3, &R::predicted_seconds},
  };
  return fields;
}

}  // namespace moeserve
