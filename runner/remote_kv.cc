// KV pieces held by worker processes (see remote_kv.h).
#include "runner/remote_kv.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

absl::Status RemoteKvPieces::Fetch(const std::vector<KvBlockPart>& pieces) {
  std::map<int, KvPieceOp> ops;
  std::map<Key, size_t> bytes;  // each wanted piece's size, to check the answers
  for (const KvBlockPart& p : pieces) {
    const Key key{p.remote_rank, p.remote_block};
    if (cache_.count(key) > 0 || !bytes.emplace(key, p.bytes).second) continue;
    ops[p.remote_rank].blocks.push_back(p.remote_block);
  }
  if (ops.empty()) return absl::OkStatus();
  std::map<int, std::string> replies;
  RETURN_IF_ERROR(Exchange(ops, &replies));
  for (const auto& [rank, op] : ops) {
    const std::string& data = replies[rank];
    size_t offset = 0;
    for (int32_t block : op.blocks) {
      const size_t n = bytes[{rank, block}];
      if (data.size() < offset + n) {
        return Lose(absl::InternalError(
            absl::StrCat("KV pieces from ", channel_->DescribeRank(rank), ": ", data.size(), " bytes, expected more")));
      }
      cache_[{rank, block}].bytes.assign(data, offset, n);
      offset += n;
    }
  }
  return absl::OkStatus();
}

bool RemoteKvPieces::Read(const KvBlockPart& piece, uint8_t* out) const {
  auto it = cache_.find({piece.remote_rank, piece.remote_block});
  if (it == cache_.end() || it->second.bytes.size() != piece.bytes) return false;
  std::memcpy(out, it->second.bytes.data(), piece.bytes);
  return true;
}

void RemoteKvPieces::Write(const KvBlockPart& piece, const uint8_t* data) {
  Piece& p = cache_[{piece.remote_rank, piece.remote_block}];
  p.bytes.assign(reinterpret_cast<const char*>(data), piece.bytes);
  p.written = true;
}

absl::Status RemoteKvPieces::Commit() {
  std::map<int, KvPieceOp> ops;
  for (const auto& [key, piece] : cache_) {  // block order within each rank
    if (!piece.written) continue;
    KvPieceOp& op = ops[key.first];
    op.write = true;
    op.blocks.push_back(key.second);
    op.data += piece.bytes;
  }
  cache_.clear();
  if (ops.empty()) return absl::OkStatus();
  std::map<int, std::string> replies;
  return Exchange(ops, &replies);
}

absl::Status RemoteKvPieces::Exchange(const std::map<int, KvPieceOp>& ops, std::map<int, std::string>* replies) {
  if (!lost_.ok()) return lost_;  // a peer may be gone: nothing more is sent
  // Under the job's step timeout, as a step is: a rank that stops answering ends the wait.
  channel_->BeginStep();
  absl::Status s = absl::OkStatus();
  for (const auto& [rank, op] : ops) {
    if (s = channel_->SendKv(rank, op); !s.ok()) break;
  }
  for (const auto& [rank, op] : ops) {
    if (!s.ok()) break;
    s = channel_->ReceiveKv(rank, &(*replies)[rank]);
  }
  channel_->EndStep();
  return s.ok() ? s : Lose(s);
}

absl::Status RemoteKvPieces::Lose(const absl::Status& s) {
  cache_.clear();
  lost_ = absl::UnavailableError(absl::StrCat("KV pieces: ", s.message()));
  on_lost_(s);
  return lost_;
}

absl::Status ServeKvPieces(const KvPieceOp& op, Backend* backend, const KvStorage& arena, std::string* out) {
  const size_t bytes = arena.layout().BlockBytes();
  const int64_t blocks = arena.layout().num_blocks;
  for (int32_t b : op.blocks) {
    if (b < 0 || b >= blocks) {
      return absl::InvalidArgumentError(absl::StrCat("KV piece copy: block ", b, " outside the arena's ", blocks));
    }
  }
  const size_t total = op.blocks.size() * bytes;
  if (op.write && op.data.size() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV piece copy: ", op.data.size(), " bytes of data for ", op.blocks.size(), " pieces of ", bytes));
  }
  if (!op.write) out->assign(total, '\0');
  uint8_t* base = static_cast<uint8_t*>(arena.data());
  uint64_t last = 0;
  for (size_t i = 0; i < op.blocks.size(); ++i) {
    uint8_t* device = base + static_cast<size_t>(op.blocks[i]) * bytes;
    ASSIGN_OR_RETURN(last, op.write ? backend->CopyAsync(device, op.data.data() + i * bytes, bytes)
                                    : backend->CopyAsync(out->data() + i * bytes, device, bytes));
  }
  if (!op.blocks.empty()) RETURN_IF_ERROR(backend->WaitCopy(last));
  // The next step's compute reads the written pieces.
  if (op.write) backend->OrderComputeAfterCopies();
  return absl::OkStatus();
}

}  // namespace moeserve
