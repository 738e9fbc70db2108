// Rank step messages: little-endian fields in a fixed order, every vector with its length; and the
// step's exchanges after the last arrival, read from the ranks' results.
#include "runner/rank_step.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

constexpr uint32_t kStepMagic = 0x4d535354;      // "MSST"
constexpr uint32_t kShutdownMagic = 0x4d53444e;  // "MSDN"
constexpr uint32_t kResultMagic = 0x4d535253;    // "MSRS"
constexpr uint32_t kKvOpMagic = 0x4d534b56;      // "MSKV"
constexpr uint32_t kKvReplyMagic = 0x4d534b52;   // "MSKR"
constexpr uint32_t kReplaceMagic = 0x4d535250;   // "MSRP"
constexpr uint32_t kReplaceReplyMagic = 0x4d535252;  // "MSRR"

class Writer {
 public:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out_.append(s);
  }
  // A reply's status: its code and message.
  void PutStatus(const absl::Status& status) {
    Put<int32_t>(static_cast<int32_t>(status.code()));
    PutString(std::string(status.message()));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  absl::Status Get(T* v, const char* field) {
    if (in_.size() - pos_ < sizeof(T)) return Truncated(field);
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status GetVector(std::vector<T>* v, const char* field) {
    uint64_t n = 0;
    RETURN_IF_ERROR(Get(&n, field));
    if (n > (in_.size() - pos_) / sizeof(T)) return Truncated(field);
    v->resize(n);
    std::memcpy(v->data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetString(std::string* s, const char* field) {
    uint64_t n = 0;
    RETURN_IF_ERROR(Get(&n, field));
    if (n > in_.size() - pos_) return Truncated(field);
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  // A reply's status (PutStatus), refused when its code is not one absl knows; `what` names the
  // message in that error.
  absl::Status GetStatus(absl::Status* status, const char* what) {
    int32_t code = 0;
    std::string message;
    RETURN_IF_ERROR(Get(&code, "status code"));
    RETURN_IF_ERROR(GetString(&message, "status message"));
    if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": status code ", code));
    }
    *status = absl::Status(static_cast<absl::StatusCode>(code), message);
    return absl::OkStatus();
  }
  absl::Status Done() const {
    if (pos_ != in_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank step message: ", in_.size() - pos_, " bytes left over"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Truncated(const char* field) const {
    return absl::InvalidArgumentError(absl::StrCat("rank step message: truncated at ", field,
                                                   " (byte ", pos_, " of ", in_.size(), ")"));
  }
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

std::string EncodeRankStep(const std::vector<SubStep>& subs) {
  Writer w;
  w.Put(kStepMagic);
  w.Put<uint64_t>(subs.size());
  for (const SubStep& s : subs) {
    const ForwardInput& in = s.in;
    w.PutVector(in.token_ids);
    w.PutVector(in.positions);
    w.PutVector(in.token_seq);
    w.PutVector(in.slots);
    w.PutVector(in.block_tables);
    w.Put(in.num_seqs);
    w.Put(in.max_blocks_per_seq);
    w.PutVector(in.logit_rows);
    w.PutVector(in.sample);
    w.PutVector(in.logit_edits);
    w.Put<uint8_t>(in.logits_to_host ? 1 : 0);
    w.PutVector(s.logit_dest);
  }
  return w.Take();
}

std::string EncodeKvPieceOp(const KvPieceOp& op) {
  Writer w;
  w.Put(kKvOpMagic);
  w.Put<uint8_t>(op.write ? 1 : 0);
  w.PutVector(op.blocks);
  w.PutString(op.data);
  return w.Take();
}

std::string EncodeReplaceOp(const ReplaceOp& op) {
  Writer w;
  w.Put(kReplaceMagic);
  w.Put<uint8_t>(static_cast<uint8_t>(op.phase));
  w.Put(op.layer);
  w.Put<uint64_t>(op.row.size());
  for (const std::vector<int32_t>& ranks : op.row) w.PutVector(ranks);
  return w.Take();
}

namespace {

absl::Status DecodeReplaceOp(Reader& r, ReplaceOp* op) {
  uint8_t phase = 0;
  RETURN_IF_ERROR(r.Get(&phase, "phase"));
  if (phase > static_cast<uint8_t>(ReplaceOp::Phase::kDrop)) {
    return absl::InvalidArgumentError(absl::StrCat("re-placement message: phase ", phase));
  }
  op->phase = static_cast<ReplaceOp::Phase>(phase);
  RETURN_IF_ERROR(r.Get(&op->layer, "layer"));
  uint64_t experts = 0;
  RETURN_IF_ERROR(r.Get(&experts, "experts"));
  if (experts > 65536) return absl::InvalidArgumentError(absl::StrCat("re-placement message: ", experts, " experts"));
  op->row.assign(experts, {});
  for (std::vector<int32_t>& ranks : op->row) RETURN_IF_ERROR(r.GetVector(&ranks, "holders"));
  return r.Done();
}

}  // namespace

std::string EncodeReplaceReply(const absl::Status& status, const ReplaceReply& reply) {
  Writer w;
  w.Put(kReplaceReplyMagic);
  w.PutStatus(status);
  w.Put(reply.experts);
  w.Put(reply.bytes);
  return w.Take();
}

absl::Status DecodeReplaceReply(const std::string& bytes, absl::Status* status, ReplaceReply* reply) {
  Reader r(bytes);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Get(&magic, "magic"));
  if (magic != kReplaceReplyMagic) return absl::InvalidArgumentError("re-placement reply: bad magic");
  RETURN_IF_ERROR(r.GetStatus(status, "re-placement reply"));
  RETURN_IF_ERROR(r.Get(&reply->experts, "experts"));
  RETURN_IF_ERROR(r.Get(&reply->bytes, "bytes"));
  return r.Done();
}

std::string EncodeShutdown() {
  Writer w;
  w.Put(kShutdownMagic);
  return w.Take();
}

absl::StatusOr<WorkerMessage> DecodeWorkerMessage(const std::string& bytes, std::vector<SubStep>* subs,
                                                  KvPieceOp* kv, ReplaceOp* replace) {
  Reader r(bytes);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Get(&magic, "magic"));
  if (magic == kShutdownMagic) return WorkerMessage::kShutdown;
  if (magic == kReplaceMagic) {
    RETURN_IF_ERROR(DecodeReplaceOp(r, replace));
    return WorkerMessage::kReplace;
  }
  if (magic == kKvOpMagic) {
    uint8_t write = 0;
    RETURN_IF_ERROR(r.Get(&write, "write"));
    kv->write = write != 0;
    RETURN_IF_ERROR(r.GetVector(&kv->blocks, "blocks"));
    RETURN_IF_ERROR(r.GetString(&kv->data, "data"));
    RETURN_IF_ERROR(r.Done());
    return WorkerMessage::kKvPieces;
  }
  if (magic != kStepMagic)
    return absl::InvalidArgumentError("rank step message: not a step (bad magic)");
  uint64_t n = 0;
  RETURN_IF_ERROR(r.Get(&n, "micro-batches"));
  if (n > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("rank step message: ", n, " micro-batches (at most 64)"));
  subs->assign(n, SubStep());
  for (SubStep& s : *subs) {
    ForwardInput& in = s.in;
    RETURN_IF_ERROR(r.GetVector(&in.token_ids, "token_ids"));
    RETURN_IF_ERROR(r.GetVector(&in.positions, "positions"));
    RETURN_IF_ERROR(r.GetVector(&in.token_seq, "token_seq"));
    RETURN_IF_ERROR(r.GetVector(&in.slots, "slots"));
    RETURN_IF_ERROR(r.GetVector(&in.block_tables, "block_tables"));
    RETURN_IF_ERROR(r.Get(&in.num_seqs, "num_seqs"));
    RETURN_IF_ERROR(r.Get(&in.max_blocks_per_seq, "max_blocks_per_seq"));
    RETURN_IF_ERROR(r.GetVector(&in.logit_rows, "logit_rows"));
    RETURN_IF_ERROR(r.GetVector(&in.sample, "sample"));
    RETURN_IF_ERROR(r.GetVector(&in.logit_edits, "logit_edits"));
    uint8_t to_host = 0;
    RETURN_IF_ERROR(r.Get(&to_host, "logits_to_host"));
    in.logits_to_host = to_host != 0;
    RETURN_IF_ERROR(r.GetVector(&s.logit_dest, "logit_dest"));
    if (s.logit_dest.size() != in.logit_rows.size()) {
      return absl::InvalidArgumentError(
          "rank step message: logit_dest and logit_rows differ in length");
    }
  }
  RETURN_IF_ERROR(r.Done());
  return WorkerMessage::kStep;
}

std::string EncodeRankResult(const absl::Status& status, const RankStepResult& res) {
  Writer w;
  w.Put(kResultMagic);
  w.PutStatus(status);
  const ForwardStats& f = res.stats;
  w.Put(f.tokens);
  w.Put(f.experts_hit);
  w.Put(f.expert_assignments);
  w.Put(f.attention_seconds);
  w.Put(f.moe_seconds);
  w.Put(f.head_seconds);
  w.PutVector(f.expert_rows);
  w.PutVector(f.layer_expert_rows);
  w.Put(f.comm_seconds);
  w.Put(f.comm_bytes);
  w.Put(f.comm_bytes_outside);
  w.PutVector(f.collective_spans);
  w.Put(res.a2a_bytes);
  w.Put(res.pp_bytes);
  w.Put(res.comm_seconds);
  w.Put(res.clock_id);
  w.PutVector(res.logits);
  w.PutVector(res.sampled);
  return w.Take();
}

absl::Status DecodeRankResult(const std::string& bytes, RankStepResult* res) {
  Reader r(bytes);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Get(&magic, "magic"));
  if (magic != kResultMagic) return absl::InvalidArgumentError("rank result message: bad magic");
  absl::Status status;
  RETURN_IF_ERROR(r.GetStatus(&status, "rank result message"));
  ForwardStats& f = res->stats;
  RETURN_IF_ERROR(r.Get(&f.tokens, "tokens"));
  RETURN_IF_ERROR(r.Get(&f.experts_hit, "experts_hit"));
  RETURN_IF_ERROR(r.Get(&f.expert_assignments, "expert_assignments"));
  RETURN_IF_ERROR(r.Get(&f.attention_seconds, "attention_seconds"));
  RETURN_IF_ERROR(r.Get(&f.moe_seconds, "moe_seconds"));
  RETURN_IF_ERROR(r.Get(&f.head_seconds, "head_seconds"));
  RETURN_IF_ERROR(r.GetVector(&f.expert_rows, "expert_rows"));
  RETURN_IF_ERROR(r.GetVector(&f.layer_expert_rows, "layer_expert_rows"));
  RETURN_IF_ERROR(r.Get(&f.comm_seconds, "comm_seconds"));
  RETURN_IF_ERROR(r.Get(&f.comm_bytes, "comm_bytes"));
  RETURN_IF_ERROR(r.Get(&f.comm_bytes_outside, "comm_bytes_outside"));
  RETURN_IF_ERROR(r.GetVector(&f.collective_spans, "collective_spans"));
  RETURN_IF_ERROR(r.Get(&res->a2a_bytes, "a2a_bytes"));
  RETURN_IF_ERROR(r.Get(&res->pp_bytes, "pp_bytes"));
  RETURN_IF_ERROR(r.Get(&res->comm_seconds, "rank comm_seconds"));
  RETURN_IF_ERROR(r.Get(&res->clock_id, "clock_id"));
  RETURN_IF_ERROR(r.GetVector(&res->logits, "logits"));
  RETURN_IF_ERROR(r.GetVector(&res->sampled, "sampled"));
  RETURN_IF_ERROR(r.Done());
  return status;
}

std::string EncodeKvPieceReply(const absl::Status& status, const std::string& data) {
  Writer w;
  w.Put(kKvReplyMagic);
  w.PutStatus(status);
  w.PutString(data);
  return w.Take();
}

absl::Status DecodeKvPieceReply(const std::string& bytes, std::string* data) {
  Reader r(bytes);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Get(&magic, "magic"));
  if (magic != kKvReplyMagic) return absl::InvalidArgumentError("KV piece reply: bad magic");
  absl::Status status;
  RETURN_IF_ERROR(r.GetStatus(&status, "KV piece reply"));
  RETURN_IF_ERROR(r.GetString(data, "data"));
  RETURN_IF_ERROR(r.Done());
  return status;
}

uint64_t MachineClockId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id) || id.empty()) return 0;
  return std::hash<std::string>()(id) | 1;  // never 0, which means unknown
}

double AfterLastArrival(const std::vector<int64_t>& stage, const std::vector<RankStepResult>& results) {
  for (const RankStepResult& r : results) {
    if (r.clock_id == 0 || r.clock_id != results.front().clock_id) return 0;  // not one clock
  }
  std::map<int64_t, std::vector<const std::vector<double>*>> stages;
  for (size_t r = 0; r < results.size(); ++r) stages[stage[r]].push_back(&results[r].stats.collective_spans);
  double total = 0;
  for (const auto& entry : stages) {
    const std::vector<const std::vector<double>*>& spans = entry.second;
    const size_t n = spans.front()->size();
    if (std::any_of(spans.begin(), spans.end(), [n](const std::vector<double>* s) { return s->size() != n; })) {
      continue;
    }
    for (size_t k = 0; k + 1 < n; k += 2) {
      double entry = 0, exit = 0;
      for (const std::vector<double>* s : spans) {
        entry = std::max(entry, (*s)[k]);
        exit = std::max(exit, (*s)[k + 1]);
      }
      total += exit - entry;
    }
  }
  return total;
}

}  // namespace moeserve
