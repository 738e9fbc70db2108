// A step as the ranks run it, written sequence by sequence. The executor states how it cuts a
// step (StepCut: each EP rank's segment of the KV block pool, and how many micro-batches a
// pipeline wants), and the engine's batch builder writes every sequence straight into its
// rank's sub-step, in the block ids of that rank's KV arena. One device is the cut of one part.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/moe_model.h"
#include "runner/rank_step.h"

namespace moeserve {

struct StepCut {
  int64_t block_size = 16;
  int64_t micro_batches = 1;  // each EP rank's sequences go in this many consecutive groups
  // The first pool block of each EP rank's segment, then the pool's end: rank e's arena holds
  // blocks [segment_begin[e], segment_begin[e + 1]), numbered from 0.
  std::vector<int64_t> segment_begin;

  // The whole pool on one device.
  static StepCut One(int64_t num_blocks, int64_t block_size);
  int64_t ranks() const { return static_cast<int64_t>(segment_begin.size()) - 1; }
  // The EP rank whose segment holds `block` (the last one for blocks past the pool).
  int64_t RankOf(int32_t block) const;
};

// parts[EP rank][micro-batch]: each sub-step's logit_dest numbers its logit rows in the step's
// output order, 0 .. num_logit_rows - 1 over all parts.
struct StepParts {
  std::vector<std::vector<SubStep>> parts;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t num_logit_rows = 0;
  bool logits_to_host = false;
  bool sampling = false;  // every logit row has a sampling spec (else none has)
};

class StepWriter {
 public:
  // `seq_ranks`: the EP rank of each sequence, in the order they will be begun (a rank's
  // sequences are cut into micro-batches of consecutive ones).
  StepWriter(const StepCut& cut, const std::vector<int64_t>& seq_ranks);

  // The next sequence and its pool blocks; the blocks its tokens reach must lie in its rank's
  // segment (Finish refuses the step otherwise).
  void BeginSequence(std::span<const int32_t> blocks);
  // A token of the current sequence at `position` (its KV slot follows from the blocks).
  void AddToken(int32_t token, int32_t position);
  // Asks for the logits of the last token added, as row `dest` of the step's output, sampled by
  // `spec` on the device (or not sampled: null). Returns the row within its sub-step, the row
  // that edits() of the current sub-step name.
  int32_t AddLogitRow(int64_t dest, const SampleSpec* spec);
  std::vector<LogitEdit>* edits();
  void RequestLogitsToHost() { logits_to_host_ = true; }

  // The block tables, in each arena's ids. INVALID_ARGUMENT, naming the sequence, where its
  // blocks leave its rank's segment, or its tokens reach past its blocks; also where the calls
  // broke the order above (more sequences than announced, a token before any sequence, a logit
  // row before the sequence's first token).
  absl::StatusOr<StepParts> Finish();

 private:
  struct Seq {
    int64_t rank = 0, micro = 0, local = 0;  // where it goes, and its index there
    std::vector<int32_t> blocks;
    int64_t reach = 0;  // blocks its tokens reach
    int64_t tokens = 0;
  };
  SubStep& Current();
  // The current sequence, or null (noting the misuse `what` for Finish) before the first.
  Seq* Active(const char* what);

  const StepCut& cut_;
  std::vector<Seq> seqs_;
  int64_t next_ = 0;  // sequences begun
  StepParts out_;
  bool logits_to_host_ = false;
  int64_t with_spec_ = 0, without_spec_ = 0;
  std::string misuse_;  // the first call out of order
  std::vector<LogitEdit> discarded_edits_;
};

// Every logit row of `step` has one destination, each of 0 .. num_logit_rows - 1 exactly once,
// and a sampling spec exactly when step.sampling: what gathering the outputs relies on.
absl::Status CheckLogitRows(const StepParts& step);

// A flat step (one ForwardInput, as one device runs it) written through a StepWriter: a
// sequence's rank is the one its first block's segment belongs to; logit rows keep their order.
absl::StatusOr<StepParts> CutStep(const ForwardInput& flat, const StepCut& cut);

}  // namespace moeserve
