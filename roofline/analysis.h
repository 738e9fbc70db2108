// The lecture-style numbers of a model on a machine: critical batch, latency floor, drain time,
// KV capacity limits, and predicted step time, throughput and cost over batch sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "roofline/cost_model.h"

namespace moeserve::roofline {

struct RooflineInputs {
  ModelCosts model;
  HardwareProfile hw;
  ParallelLayout layout;
  int64_t context = 1024;        // tokens per sequence, for KV terms
  std::vector<int64_t> batches;  // rows of the table
  double price_per_hour = 0;     // $ per device-hour
};

struct RooflineRow {
  int64_t batch = 0;  // per micro-batch; pp micro-batches are in flight with pp stages
  StepCost cost;
  double tokens_per_second = 0;
  double usd_per_million_tokens = 0;
  bool kv_fits = true;
};

struct RooflineReport {
  double flops_per_byte = 0;  // peak bf16 FLOP/s over memory bandwidth
  // Compute time = weight time with every weight read: ratio x (bytes/param / 2) x total/active.
  double critical_batch = 0;
  // The same for the routed-expert layers alone: ratio x (bytes/param / 2) x experts/top-k.
  double critical_batch_routed_experts = 0;
  // Where predicted compute time meets weight time, with the expected experts hit at that batch.
  double critical_batch_moe_aware = 0;
  double latency_floor_seconds = 0;         // all weights once over the aggregate bandwidth (fully sharded)
  double latency_floor_layout_seconds = 0;  // ... with this layout: each EP rank reads the dense weights
  double latency_floor_batch1_seconds = 0;  // a batch-1 decode step at the context (few experts hit)
  double drain_seconds = 0;                 // memory capacity over bandwidth
  double kv_bytes_per_token = 0;
  int64_t max_batch_kv_fits = 0;            // at the context, in what the weights leave free
  double kv_equals_weights_context_batch1 = 0;
  double kv_equals_weights_context_at_critical = 0;
  std::vector<RooflineRow> rows;
};

RooflineReport AnalyzeRoofline(const RooflineInputs& in);

// The smallest batch of decodes at `context` whose predicted compute time reaches its memory
// time (weights of the experts expected to be hit, plus KV), by PredictStep on one device;
// 0 when no batch up to 2^20 is compute-bound.
int64_t SmallestComputeBoundBatch(const ModelCosts& m, const HardwareProfile& hw, int64_t context);

// FLOPs per byte that one more decoding sequence at `context` adds once the weights are read
// anyway (its attention and GEMM FLOPs over its KV bytes). When it is below the machine's
// FLOP/byte, no batch is compute-bound: the KV term grows with the batch as fast as the FLOPs.
double MarginalDecodeIntensity(const ModelCosts& m, const HardwareProfile& hw, int64_t context);

// Why SmallestComputeBoundBatch found no batch: a sentence naming both intensities.
std::string NoCriticalBatchReason(const ModelCosts& m, const HardwareProfile& hw, int64_t context);

}  // namespace moeserve::roofline
