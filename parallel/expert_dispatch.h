// Expert parallelism inside one MoE layer: dispatch and combine over an EP group.
//
// Each rank brings its own tokens (attention is data-parallel) and holds some experts
// (holders[layer][e]: the ranks holding expert e in that layer, parallel/placement.h). Run sends
// every token's hidden state to the ranks holding its top-k experts (all-to-all with per-peer counts, exchanged first), runs this
// rank's experts on the rows it received, grouped by expert, sends the results back the way
// they came and combines them into the residual as on one rank. A rank with no tokens still
// takes part in every all-to-all.
//
// Every buffer handed to the communicator is device memory of the rank's backend (host memory on
// the CPU backend), so the same code runs over LocalCommunicator, MPI and NCCL. The rows are
// planned on the device (Backend::PlanRouting, as on one rank); only counts visit the host: each
// expert's row count is read back once per layer (the all-to-all takes per-peer counts on the
// host), and the receivers plan their grouped GEMMs from the per-(peer, expert) counts alone,
// without the rows' expert ids.
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
  // ... of which to ranks of other domains (the constructor's domain_size; 0 with one domain):
  // the per-expert counts, the rows out and their results back, as the wire carries them.
  int64_t comm_bytes_outside = 0;
  // Each collective's entry and exit on the steady clock (seconds; the same clock for every
  // process of one machine), in call order: with the other ranks' spans, the time from the last
  // rank's arrival to the exchange's end, which waiting for a slower rank does not enter.
  std::vector<double> spans;  // [calls x 2]
};

class ExpertDispatch {
 public:
  // `ep` (more than one rank) and `backend` must outlive this object.
  // holders[l][e]: the ranks holding expert e in the l-th layer this object serves (the layers
  // of the rank's stage, in order), ascending. An expert held by r ranks has the rows each
  // sender routes to it cut into r runs in token order (run i of n rows: [n i / r, n (i + 1) / r)),
  // run i going to its (i + sender's rank) mod r-th holder: every row computed once, and the
  // senders' single rows of a decode step spread over the copies. With `domain_size` D > 0 (EP
  // rank q in domain q / D), a sender's rows go only to the copies in its own domain where it has
  // any (NearHolders, parallel/placement.h), cut the same way among them.
  ExpertDispatch(Backend* backend, Communicator* ep, const std::vector<std::vector<std::vector<int32_t>>>& holders,
                 ExpertDispatchShape shape, int64_t domain_size = 0);

  // xn [tokens, hidden]: the tokens' normalised hidden states; ids [tokens, top_k]: their experts;
  // weights [tokens, top_k]: the router's weights (all device memory); w13, w2: the layer's
  // expert weights ([experts]; only this rank's entries are read). Adds the weighted expert
  // outputs to x [tokens, hidden] (device). One copy to the host when tokens > 0, none otherwise.
  // `layer` indexes the owner table given at construction.
  absl::Status Run(int64_t layer, const float* xn, const int32_t* ids, const float* weights, int64_t tokens,
                   std::span<const WeightRef> w13, std::span<const WeightRef> w2, float* x,
                   ExpertDispatchStats* stats);

  // The hidden rows go to the experts as bf16, half the bytes. Only where every rank's expert
  // GEMM rounds its activations to bf16 anyway (Backend::RoundsActivationsToBf16): the result
  // is then bit for bit the fp32 wire's. The results come back in fp32 either way.
  void set_bf16_rows(bool on) { bf16_rows_ = on; }
  bool bf16_rows() const { return bf16_rows_; }

 private:
  // Grows the send-side buffers to `rows` assignments, the receive side to `rows` received rows.
  absl::Status EnsureSendRows(int64_t rows);
  absl::Status EnsureReceiveRows(int64_t rows);
  // The send side: the device plan, each expert's count read back, the per-(peer, expert)
  // counts, and the send order where the placement interleaves ranks.
  absl::Status PlanSend(const int32_t* ids, int64_t tokens);
  // The receive side, from the counts received: the rows this rank gets (returned), their
  // expert order, this rank's statistics.
  absl::StatusOr<int64_t> PlanReceive(ExpertDispatchStats* stats);

  Backend* backend_;
  Communicator* ep_;
  ExpertDispatchShape shape_;
  int64_t domain_size_ = 0;  // EP ranks per domain; 0: one domain
  bool bf16_rows_ = false;
  // One layer's placement as the dispatch uses it.
  struct LayerPlacement {
    std::vector<std::vector<int32_t>> experts_of;  // each rank's experts, ascending
    std::vector<std::vector<int32_t>> holders;     // each expert's ranks, ascending
    std::vector<std::vector<int32_t>> near;        // the holders this rank's rows of each expert go to
    bool rank_major = false;  // one rank per expert, expert order rank order (contiguous ranges)
  };
  // The sorted rows [begin, end) of expert e this rank sends to `peer` (one of e's holders;
  // empty for a holder outside the near ones).
  std::pair<int64_t, int64_t> RowsFor(int32_t e, size_t peer) const;
  // Bytes this rank sends to ranks of other domains: its counts, the rows out (`wire_bytes`
  // each) and the results back (`row_bytes` each).
  int64_t OutsideBytes(int64_t wire_bytes, int64_t row_bytes) const;
  std::vector<LayerPlacement> layers_;
  const LayerPlacement* placement_ = nullptr;  // the layer being run
  int64_t max_local_ = 0;  // the most experts one rank holds in any layer: counts exchanged per peer
  // Send side (this rank's assignments): the device plan (expert offsets, the token of each
  // sorted row, the sorted row of each assignment), the send order where a layer's placement
  // interleaves the ranks (send_perm_ composed into the token of each send row, combine_rows_
  // into the send row of each assignment, so the rows move once each way), hidden rows, the
  // results that come back.
  DeviceBuffer plan_offsets_, gather_rows_, combine_rows_, send_perm_, send_unperm_, send_x_, send_bf16_, results_;
  int64_t send_capacity_ = 0;
  // Receive side (rows from every rank): hidden states as received, the gather indices into
  // expert order and back, the expert GEMMs, the group offsets.
  DeviceBuffer recv_x_, recv_bf16_, perm_, unperm_, in_, gate_up_, act_, out_, offsets_;
  int64_t receive_capacity_ = 0;
  // The host's share: counts only.
  std::vector<int64_t> host_offsets_, host_group_offsets_, send_counts_, recv_counts_, send_rows_, recv_rows_;
  std::vector<int32_t> host_perm_, host_unperm_;
};

}  // namespace moeserve
