// Expert parallelism inside one MoE layer: dispatch and combine over an EP group.
//
// Each rank brings its own tokens (attention is data-parallel) and holds some experts
// (expert_owner[e] is the rank computing expert e). Run sends every token's hidden state to the
// ranks owning its top-k experts (all-to-all with per-peer counts, exchanged first), runs this
// rank's experts on the rows it received, grouped by expert, sends the results back the way
// they came and combines them into the residual as on one rank. A rank with no tokens still
// takes part in every all-to-all.
//
// Every buffer handed to the communicator is device memory of the rank's backend (host memory on
// the CPU backend), so the same code runs over LocalCommunicator, MPI and NCCL; only the plan
// (expert ids and counts, a few bytes per row) visits the host, as the all-to-all takes its
// per-peer counts on the host.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "parallel/communicator.h"

namespace moeserve {

struct ExpertDispatchShape {
  int64_t hidden = 0;
  int64_t intermediate = 0;  // per routed expert
  int64_t num_experts = 0;
  int64_t top_k = 0;
};

// What one layer's dispatch did (added to the caller's totals).
struct ExpertDispatchStats {
  std::vector<int64_t> expert_rows;  // [experts]: rows this rank's experts computed
  int64_t experts_hit = 0;           // this rank's experts that computed rows
  int64_t assignments = 0;           // this rank's (token, slot) pairs
  double comm_seconds = 0;
  int64_t comm_bytes = 0;  // sent to other ranks
};

class ExpertDispatch {
 public:
  // `ep` (more than one rank) and `backend` must outlive this object.
  ExpertDispatch(Backend* backend, Communicator* ep, std::vector<int32_t> expert_owner,
                 ExpertDispatchShape shape);

  // xn [tokens, hidden]: the tokens' normalised hidden states (device); ids [tokens, top_k]: their
  // experts (host); weights [tokens, top_k]: the router's weights (device); w13, w2: the layer's
  // expert weights ([experts]; only this rank's entries are read). Adds the weighted expert
  // outputs to x [tokens, hidden] (device).
  absl::Status Run(const float* xn, std::span<const int32_t> ids, const float* weights,
                   int64_t tokens, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                   float* x, ExpertDispatchStats* stats);

  // The hidden rows go to the experts as bf16, half the bytes. Only where every rank's expert
  // GEMM rounds its activations to bf16 anyway (Backend::RoundsActivationsToBf16): the result
  // is then bit for bit the fp32 wire's. The results come back in fp32 either way.
  void set_bf16_rows(bool on) { bf16_rows_ = on; }
  bool bf16_rows() const { return bf16_rows_; }

 private:
  // Grows the send-side buffers to `rows` assignments, the receive side to `rows` received rows.
  absl::Status EnsureSendRows(int64_t rows);
  absl::Status EnsureReceiveRows(int64_t rows);

  Backend* backend_;
  Communicator* ep_;
  std::vector<int32_t> expert_owner_;
  ExpertDispatchShape shape_;
  bool bf16_rows_ = false;
  // Send side (this rank's assignments in send order): expert ids, gather indices, hidden rows,
  // the results that come back, and the combine map.
  DeviceBuffer send_ids_, gather_rows_, send_x_, send_bf16_, results_, combine_rows_;
  int64_t send_capacity_ = 0;
  // Receive side (rows from every rank): hidden states and expert ids as received, the gather
  // indices into expert order and back, the expert GEMMs, the group offsets.
  DeviceBuffer recv_x_, recv_bf16_, recv_ids_, perm_, unperm_, in_, gate_up_, act_, out_, offsets_;
  int64_t receive_capacity_ = 0;
  // The host plan.
  std::vector<int32_t> order_, send_experts_, recv_experts_, host_gather_, host_combine_;
  std::vector<int64_t> host_offsets_;
};

}  // namespace moeserve
