// The two step channels (see step_channel.h).
#include "runner/step_channel.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

absl::Status ThreadChannel::Send(int rank, const std::vector<SubStep>& subs) {
  std::lock_guard<std::mutex> lock(mu_);
  Box& b = boxes_[static_cast<size_t>(rank)];
  b.step = &subs;
  b.taken = b.replied = false;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status ThreadChannel::Receive(int rank, RankStepResult* result) {
  std::unique_lock<std::mutex> lock(mu_);
  Box& b = boxes_[static_cast<size_t>(rank)];
  cv_.wait(lock, [&] { return b.replied; });
  b.step = nullptr;
  b.replied = false;
  *result = std::move(b.result);
  return std::exchange(b.status, absl::OkStatus());
}

absl::Status ThreadChannel::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<WorkerTask> ThreadChannel::Next(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  Box& b = boxes_[static_cast<size_t>(rank)];
  cv_.wait(lock, [&] { return shutdown_ || (b.step != nullptr && !b.taken); });
  if (shutdown_) return WorkerTask{};
  b.taken = true;
  return WorkerTask{b.step, nullptr};
}

absl::Status ThreadChannel::Reply(int rank, const absl::Status& status, RankStepResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  Box& b = boxes_[static_cast<size_t>(rank)];
  b.status = status;
  b.result = std::move(result);
  b.replied = true;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status ThreadChannel::ReplyKv(int rank, const absl::Status&, const std::string&) {
  return absl::InternalError(absl::StrCat("rank ", rank, ": in-process ranks are never sent KV piece copies"));
}

absl::Status ThreadChannel::ReplyReplace(int rank, const absl::Status&, const ReplaceReply&) {
  return absl::InternalError(absl::StrCat("rank ", rank, ": in-process ranks are never sent re-placements"));
}

std::string ThreadChannel::DescribeRank(int rank) const { return absl::StrCat("rank ", rank); }

absl::Status ProcessChannel::Send(int rank, const std::vector<SubStep>& subs) {
  return world_->SendMessage(rank, EncodeRankStep(subs));
}

absl::Status ProcessChannel::Receive(int rank, RankStepResult* result) {
  world_->WaitingFor(rank);
  ASSIGN_OR_RETURN(const std::string reply, world_->ReceiveMessage(rank));
  if (absl::Status s = DecodeRankResult(reply, result); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(world_->DescribeRank(rank), ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ProcessChannel::Shutdown() {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  // Every worker, even after a failed send, so that the others can finish.
  absl::Status first = absl::OkStatus();
  for (int r = 1; r < world_->size(); ++r) {
    absl::Status s = world_->SendMessage(r, EncodeShutdown());
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::StatusOr<WorkerTask> ProcessChannel::Next(int) {
  ASSIGN_OR_RETURN(const std::string message, world_->ReceiveMessage(0));
  ASSIGN_OR_RETURN(const WorkerMessage kind,
                   DecodeWorkerMessage(message, &received_, &received_kv_, &received_replace_));
  switch (kind) {
    case WorkerMessage::kStep: return WorkerTask{&received_, nullptr, nullptr};
    case WorkerMessage::kKvPieces: return WorkerTask{nullptr, &received_kv_, nullptr};
    case WorkerMessage::kReplace: return WorkerTask{nullptr, nullptr, &received_replace_};
    case WorkerMessage::kShutdown: break;
  }
  return WorkerTask{};
}

absl::Status ProcessChannel::ReplyKv(int, const absl::Status& status, const std::string& data) {
  return world_->SendMessage(0, EncodeKvPieceReply(status, data));
}

absl::Status ProcessChannel::ReceiveKv(int rank, std::string* data) {
  world_->WaitingFor(rank);
  ASSIGN_OR_RETURN(const std::string reply, world_->ReceiveMessage(rank));
  if (absl::Status s = DecodeKvPieceReply(reply, data); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(world_->DescribeRank(rank), ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ProcessChannel::ReplyReplace(int, const absl::Status& status, const ReplaceReply& reply) {
  return world_->SendMessage(0, EncodeReplaceReply(status, reply));
}

absl::Status ProcessChannel::ReceiveReplace(int rank, absl::Status* status, ReplaceReply* reply) {
  world_->WaitingFor(rank);
  ASSIGN_OR_RETURN(const std::string message, world_->ReceiveMessage(rank));
  if (absl::Status s = DecodeReplaceReply(message, status, reply); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(world_->DescribeRank(rank), ": ", s.message()));
  }
  if (!status->ok()) {
    *status = absl::Status(status->code(), absl::StrCat(world_->DescribeRank(rank), ": ", status->message()));
  }
  return absl::OkStatus();
}

absl::Status ProcessChannel::Reply(int, const absl::Status& status, RankStepResult result) {
  return world_->SendMessage(0, EncodeRankResult(status, result));
}

}  // namespace moeserve
