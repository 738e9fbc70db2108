// Expert-parallel dispatch and combine (moved here from the model's MoE layer).
#include "parallel/expert_dispatch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

// Grows `b` to at least `bytes` (never shrinks).
absl::Status Grow(Backend* backend, DeviceBuffer& b, size_t bytes) {
  if (!b.empty() && b.bytes() >= bytes) return absl::OkStatus();
  b = DeviceBuffer();
  ASSIGN_OR_RETURN(b, backend->Allocate(std::max<size_t>(bytes, 64)));
  return absl::OkStatus();
}

std::vector<int64_t> Scaled(const std::vector<int64_t>& rows, int64_t bytes) {
  std::vector<int64_t> out(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) out[p] = rows[p] * bytes;
  return out;
}

}  // namespace

ExpertDispatch::ExpertDispatch(Backend* backend, Communicator* ep,
                               std::vector<int32_t> expert_owner, ExpertDispatchShape shape)
    : backend_(backend), ep_(ep), expert_owner_(std::move(expert_owner)), shape_(shape) {}

absl::Status ExpertDispatch::EnsureSendRows(int64_t rows) {
  if (rows <= send_capacity_) return absl::OkStatus();
  const int64_t n = std::max<int64_t>(rows, 2 * send_capacity_);
  send_capacity_ = 0;  // until every buffer below has grown
  const size_t i32 = sizeof(int32_t), row = shape_.hidden * sizeof(float);
  RETURN_IF_ERROR(Grow(backend_, send_ids_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, gather_rows_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, combine_rows_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, send_x_, n * row));
  RETURN_IF_ERROR(Grow(backend_, send_bf16_, n * shape_.hidden * sizeof(uint16_t)));
  RETURN_IF_ERROR(Grow(backend_, results_, n * row));
  send_capacity_ = n;
  return absl::OkStatus();
}

absl::Status ExpertDispatch::EnsureReceiveRows(int64_t rows) {
  if (rows <= receive_capacity_) return absl::OkStatus();
  const int64_t n = std::max<int64_t>(rows, 2 * receive_capacity_);
  receive_capacity_ = 0;
  const size_t f = sizeof(float), i32 = sizeof(int32_t), h = shape_.hidden,
               inter = shape_.intermediate;
  RETURN_IF_ERROR(Grow(backend_, recv_x_, n * h * f));
  RETURN_IF_ERROR(Grow(backend_, recv_bf16_, n * h * sizeof(uint16_t)));
  RETURN_IF_ERROR(Grow(backend_, recv_ids_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, perm_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, unperm_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, in_, n * h * f));
  RETURN_IF_ERROR(Grow(backend_, gate_up_, n * 2 * inter * f));
  RETURN_IF_ERROR(Grow(backend_, act_, n * inter * f));
  RETURN_IF_ERROR(Grow(backend_, out_, n * h * f));
  RETURN_IF_ERROR(Grow(backend_, offsets_, (shape_.num_experts + 1) * sizeof(int64_t)));
  receive_capacity_ = n;
  return absl::OkStatus();
}

absl::Status ExpertDispatch::Run(const float* xn, std::span<const int32_t> ids,
                                 const float* weights, int64_t t, std::span<const WeightRef> w13,
                                 std::span<const WeightRef> w2, float* x,
                                 ExpertDispatchStats* stats) {
  const int64_t h = shape_.hidden, e_count = shape_.num_experts, k = shape_.top_k;
  const int n = ep_->size(), me = ep_->rank();
  const CommStats before = ep_->stats();
  const int64_t a = t * k;  // (token, slot) assignments of this rank's tokens
  if (static_cast<int64_t>(ids.size()) != a) {
    return absl::InternalError(
        absl::StrCat("expert dispatch: ", ids.size(), " ids for ", a, " assignments"));
  }
  RETURN_IF_ERROR(EnsureSendRows(std::max<int64_t>(a, 1)));

  // Order the assignments by destination rank, then expert (stable: token order within).
  order_.resize(a);
  for (int64_t i = 0; i < a; ++i) order_[i] = static_cast<int32_t>(i);
  auto key = [&](int32_t i) { return int64_t{expert_owner_[ids[i]]} * e_count + ids[i]; };
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t p, int32_t q) { return key(p) < key(q); });
  std::vector<int64_t> send_rows(n, 0), recv_rows;
  host_combine_.resize(a);
  host_gather_.resize(a);
  send_experts_.resize(a);
  for (int64_t j = 0; j < a; ++j) {
    const int32_t i = order_[j];
    const int32_t e = ids[i];
    ++send_rows[expert_owner_[e]];
    send_experts_[j] = e;
    host_gather_[j] = static_cast<int32_t>(i / k);  // send row j is token i / k's hidden state
    host_combine_[i] = static_cast<int32_t>(j);     // its result comes back as row j
  }
  // The send buffer: this rank's tokens, one row per assignment, in send order (on the device).
  float* send = send_x_.as<float>();
  if (a > 0) {
    RETURN_IF_ERROR(
        backend_->CopyToDevice(gather_rows_.data(), host_gather_.data(), a * sizeof(int32_t)));
    RETURN_IF_ERROR(
        backend_->CopyToDevice(send_ids_.data(), send_experts_.data(), a * sizeof(int32_t)));
    backend_->GatherRows(xn, gather_rows_.as<int32_t>(), a, h, send);
  }
  // Dispatch: counts, then expert ids and hidden rows.
  RETURN_IF_ERROR(ep_->AllToAllCounts(send_rows, &recv_rows));
  int64_t r_total = 0;
  for (int64_t r : recv_rows) r_total += r;
  RETURN_IF_ERROR(EnsureReceiveRows(std::max<int64_t>(r_total, 1)));
  if (bf16_rows_ && a > 0) backend_->RoundToBf16(send, a * h, send_bf16_.as<uint16_t>());
  RETURN_IF_ERROR(backend_->Synchronize());  // the communicator reads what the compute stream wrote
  const int64_t row_bytes = h * static_cast<int64_t>(sizeof(float));
  RETURN_IF_ERROR(ep_->AllToAll(send_ids_.data(), Scaled(send_rows, sizeof(int32_t)),
                                recv_ids_.data(), Scaled(recv_rows, sizeof(int32_t))));
  if (bf16_rows_) {
    const int64_t wire_bytes = h * static_cast<int64_t>(sizeof(uint16_t));
    RETURN_IF_ERROR(ep_->AllToAll(send_bf16_.data(), Scaled(send_rows, wire_bytes), recv_bf16_.data(),
                                  Scaled(recv_rows, wire_bytes)));
    if (r_total > 0) backend_->WidenBf16(recv_bf16_.as<uint16_t>(), r_total * h, recv_x_.as<float>());
  } else {
    RETURN_IF_ERROR(ep_->AllToAll(send, Scaled(send_rows, row_bytes), recv_x_.data(),
                                  Scaled(recv_rows, row_bytes)));
  }
  recv_experts_.resize(r_total);
  if (r_total > 0) {
    RETURN_IF_ERROR(
        backend_->CopyToHost(recv_experts_.data(), recv_ids_.data(), r_total * sizeof(int32_t)));
  }

  // Run this rank's experts on what it received, grouped by expert (stable).
  host_offsets_.assign(e_count + 1, 0);
  for (int32_t e : recv_experts_) {
    if (e < 0 || e >= e_count || expert_owner_[e] != me) {
      return absl::InternalError(absl::StrCat("expert parallel: rank ", me,
                                              " received a row for expert ", e,
                                              ", which it does not hold"));
    }
    ++host_offsets_[e + 1];
  }
  if (stats != nullptr && static_cast<int64_t>(stats->expert_rows.size()) != e_count) {
    stats->expert_rows.assign(e_count, 0);
  }
  for (int64_t e = 0; e < e_count; ++e) {
    if (stats != nullptr) {
      stats->expert_rows[e] += host_offsets_[e + 1];
      if (host_offsets_[e + 1] > 0) ++stats->experts_hit;
    }
    host_offsets_[e + 1] += host_offsets_[e];
  }
  // sorted_of[r]: the row of received row r in expert order; perm is its inverse.
  std::vector<int64_t> cursor(host_offsets_.begin(), host_offsets_.end() - 1);
  std::vector<int32_t> sorted_of(r_total), perm(r_total);
  for (int64_t r = 0; r < r_total; ++r) {
    sorted_of[r] = static_cast<int32_t>(cursor[recv_experts_[r]]++);
    perm[sorted_of[r]] = static_cast<int32_t>(r);
  }
  float* back = in_.as<float>();  // free again once the first expert GEMM has read it
  if (r_total > 0) {
    RETURN_IF_ERROR(backend_->CopyToDevice(perm_.data(), perm.data(), r_total * sizeof(int32_t)));
    RETURN_IF_ERROR(
        backend_->CopyToDevice(unperm_.data(), sorted_of.data(), r_total * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(offsets_.data(), host_offsets_.data(),
                                           host_offsets_.size() * sizeof(int64_t)));
    const int64_t* offsets = offsets_.as<int64_t>();
    backend_->GatherRows(recv_x_.as<float>(), perm_.as<int32_t>(), r_total, h, in_.as<float>());
    backend_->GroupedGemm(in_.as<float>(), w13, offsets, r_total, gate_up_.as<float>());
    backend_->SiluMul(gate_up_.as<float>(), r_total, shape_.intermediate, act_.as<float>());
    backend_->GroupedGemm(act_.as<float>(), w2, offsets, r_total, out_.as<float>());
    backend_->GatherRows(out_.as<float>(), unperm_.as<int32_t>(), r_total, h, back);
  }
  // Results go back the way they came (into send order), then combine as on one rank.
  RETURN_IF_ERROR(backend_->Synchronize());
  float* results = results_.as<float>();
  RETURN_IF_ERROR(
      ep_->AllToAll(back, Scaled(recv_rows, row_bytes), results, Scaled(send_rows, row_bytes)));
  if (stats != nullptr) {
    const CommStats after = ep_->stats();
    stats->comm_seconds += after.seconds - before.seconds;
    stats->comm_bytes += after.bytes_sent - before.bytes_sent;
    stats->assignments += a;
  }
  if (t == 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      backend_->CopyToDevice(combine_rows_.data(), host_combine_.data(), a * sizeof(int32_t)));
  backend_->ScatterCombine(results, combine_rows_.as<int32_t>(), weights, t, k, h, x,
                           /*accumulate=*/true);
  return absl::OkStatus();
}

}  // namespace moeserve
