// KV pieces held by worker processes (see remote_kv.h).
#include "runner/remote_kv.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

absl::Status RemoteKvPieces::Fetch(const std::vector<KvBlockPart>& pieces) {
  std::map<int, std::vector<std::pair<int32_t, size_t>>> wanted;  // per rank: (block, bytes)
  for (const KvBlockPart& p : pieces) {
    const Key key{p.remote_rank, p.remote_block};
    if (cache_.count(key) > 0) continue;
    cache_[key];  // reserved, filled below: a piece named twice is fetched once
    wanted[p.remote_rank].emplace_back(p.remote_block, p.bytes);
  }
  std::map<int, size_t> next;  // per rank: its first piece not fetched yet
  while (true) {
    std::map<int, KvPieceOp> ops;
    std::map<int, std::vector<size_t>> sizes;  // per rank: the bytes of each piece asked
    for (const auto& [rank, list] : wanted) {
      size_t bytes = 0;
      for (size_t& i = next[rank]; i < list.size() && (bytes == 0 || bytes + list[i].second <= max_message_bytes_); ++i) {
        ops[rank].blocks.push_back(list[i].first);
        sizes[rank].push_back(list[i].second);
        bytes += list[i].second;
      }
    }
    if (ops.empty()) return absl::OkStatus();
    std::map<int, std::string> replies;
    RETURN_IF_ERROR(Exchange(ops, &replies));
    for (const auto& [rank, op] : ops) {
      const std::string& data = replies[rank];
      size_t expected = 0;
      for (size_t n : sizes[rank]) expected += n;
      if (data.size() != expected) {
        return Lose(absl::InternalError(absl::StrCat("KV pieces from ", channel_->DescribeRank(rank), ": ", data.size(),
                                                     " bytes, expected ", expected)));
      }
      size_t offset = 0;
      for (size_t k = 0; k < op.blocks.size(); ++k) {
        cache_[{rank, op.blocks[k]}].bytes.assign(data, offset, sizes[rank][k]);
        offset += sizes[rank][k];
      }
    }
  }
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
  std::map<int, std::vector<const std::pair<const Key, Piece>*>> written;  // per rank, block order
  for (const auto& entry : cache_) {
    if (entry.second.written) written[entry.first.first].push_back(&entry);
  }
  std::map<int, size_t> next;
  absl::Status s = absl::OkStatus();
  while (s.ok()) {
    std::map<int, KvPieceOp> ops;
    for (const auto& [rank, list] : written) {
      KvPieceOp op;
      op.write = true;
      for (size_t& i = next[rank];
           i < list.size() && (op.data.empty() || op.data.size() + list[i]->second.bytes.size() <= max_message_bytes_);
           ++i) {
        op.blocks.push_back(list[i]->first.second);
        op.data += list[i]->second.bytes;
      }
      if (!op.blocks.empty()) ops.emplace(rank, std::move(op));
    }
    if (ops.empty()) break;
    std::map<int, std::string> replies;
    s = Exchange(ops, &replies);
  }
  cache_.clear();
  return s;
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
  std::fprintf(stderr, "moeserve: %s\n", std::string(lost_.message()).c_str());
  on_lost_(lost_);
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
