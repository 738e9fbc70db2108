// KV tiers under mpirun: the pieces of pool blocks that worker processes hold, reached by
// messages. The tiers (host DDR, flash) are rank 0's and keep whole blocks, the same records as
// with in-process ranks; a transfer list's reads of the workers' pieces are fetched before it
// runs and its writes sent after it, one message each way per worker concerned
// (kvcache/kv_storage.h, KvRemotePieces). A worker that cannot be reached loses the job, as a
// failed step does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/kv_storage.h"
#include "runner/step_channel.h"

namespace moeserve {

// Rank 0's side.
class RemoteKvPieces final : public KvRemotePieces {
 public:
  // `on_lost` gets the failure of an exchange (the job cannot go on). A list that moves more
  // than `max_message_bytes` of pieces to or from one worker goes in several rounds (an MPI
  // message holds at most INT_MAX bytes, and each piece is held a few times over on the way).
  RemoteKvPieces(ProcessChannel* channel, std::function<void(const absl::Status&)> on_lost,
                 size_t max_message_bytes = size_t{256} << 20)
      : channel_(channel), on_lost_(std::move(on_lost)), max_message_bytes_(max_message_bytes) {}

  absl::Status Fetch(const std::vector<KvBlockPart>& pieces) override;
  bool Read(const KvBlockPart& piece, uint8_t* out) const override;
  void Write(const KvBlockPart& piece, const uint8_t* data) override;
  absl::Status Commit() override;

 private:
  using Key = std::pair<int, int32_t>;  // (rank, block of its arena)
  struct Piece {
    std::string bytes;
    bool written = false;
  };
  // Sends every rank its op, then takes every answer (a read's pieces into `replies`).
  absl::Status Exchange(const std::map<int, KvPieceOp>& ops, std::map<int, std::string>* replies);
  // A failed exchange: the job is lost, and every later one fails at once.
  absl::Status Lose(const absl::Status& s);

  ProcessChannel* channel_;
  std::function<void(const absl::Status&)> on_lost_;
  size_t max_message_bytes_;
  std::map<Key, Piece> cache_;  // this transfer list's pieces
  absl::Status lost_;           // set by a failed exchange: the job is lost
};

// A worker's side: reads (into `out`, in block order) or writes the pieces `op` names in its
// arena. A block outside the arena or data of the wrong size is INVALID_ARGUMENT naming it.
absl::Status ServeKvPieces(const KvPieceOp& op, Backend* backend, const KvStorage& arena, std::string* out);

}  // namespace moeserve
