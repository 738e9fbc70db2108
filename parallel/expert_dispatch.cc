// Expert-parallel dispatch and combine (moved here from the model's MoE layer).
#include "parallel/expert_dispatch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "parallel/placement.h"

namespace moeserve {
namespace {

// Runs one collective; with `stats`, notes its entry and exit on the steady clock.
template <typename Call>
absl::Status Timed(ExpertDispatchStats* stats, Call&& call) {
  const auto seconds = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  const double entry = seconds();
  absl::Status s = call();
  if (stats != nullptr) {
    stats->spans.push_back(entry);
    stats->spans.push_back(seconds());
  }
  return s;
}

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
                               const std::vector<std::vector<std::vector<int32_t>>>& holders, ExpertDispatchShape shape,
                               int64_t domain_size)
    : backend_(backend), ep_(ep), shape_(shape), domain_size_(domain_size > 0 && domain_size < ep->size() ? domain_size : 0) {
  for (const auto& layer : holders) {
    LayerPlacement p;
    p.experts_of.assign(static_cast<size_t>(ep_->size()), {});
    p.holders = layer;
    for (const auto& h : layer) p.near.push_back(NearHolders(h, ep_->rank(), domain_size_));
    p.rank_major = true;
    int32_t last = 0;
    for (size_t e = 0; e < layer.size(); ++e) {
      MS_CHECK(!layer[e].empty() && std::is_sorted(layer[e].begin(), layer[e].end()));
      for (int32_t r : layer[e]) {
        MS_CHECK(r >= 0 && r < ep_->size());
        p.experts_of[static_cast<size_t>(r)].push_back(static_cast<int32_t>(e));
      }
      p.rank_major = p.rank_major && layer[e].size() == 1 && layer[e][0] >= last;
      last = layer[e][0];
    }
    for (const auto& mine : p.experts_of) max_local_ = std::max<int64_t>(max_local_, static_cast<int64_t>(mine.size()));
    layers_.push_back(std::move(p));
  }
}

std::pair<int64_t, int64_t> ExpertDispatch::RowsFor(int32_t e, size_t peer) const {
  const int64_t begin = host_offsets_[e], n = host_offsets_[e + 1] - begin;
  const std::vector<int32_t>& h = placement_->near[static_cast<size_t>(e)];
  const int64_t r = static_cast<int64_t>(h.size());
  const int64_t j = std::find(h.begin(), h.end(), static_cast<int32_t>(peer)) - h.begin();
  if (j == r) return {begin, begin};  // a copy in another domain: this sender uses its own domain's
  const int64_t run = ((j - ep_->rank()) % r + r) % r;  // run i goes to holder (i + rank) mod r
  return {begin + n * run / r, begin + n * (run + 1) / r};
}

int64_t ExpertDispatch::OutsideBytes(int64_t wire_bytes, int64_t row_bytes) const {
  if (domain_size_ == 0) return 0;
  int64_t bytes = 0;
  for (size_t p = 0; p < send_rows_.size(); ++p) {
    if (static_cast<int64_t>(p) / domain_size_ != ep_->rank() / domain_size_) {
      const int64_t counts = max_local_ * static_cast<int64_t>(sizeof(int64_t));  // the counts exchange's share
      bytes += counts + send_rows_[p] * wire_bytes + recv_rows_[p] * row_bytes;
    }
  }
  return bytes;
}

absl::Status ExpertDispatch::EnsureSendRows(int64_t rows) {
  if (rows <= send_capacity_) return absl::OkStatus();
  const int64_t n = std::max<int64_t>(rows, 2 * send_capacity_);
  send_capacity_ = 0;  // until every buffer below has grown
  const size_t i32 = sizeof(int32_t), row = shape_.hidden * sizeof(float);
  RETURN_IF_ERROR(Grow(backend_, plan_offsets_, (shape_.num_experts + 1) * sizeof(int64_t)));
  RETURN_IF_ERROR(Grow(backend_, gather_rows_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, combine_rows_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, send_perm_, n * i32));
  RETURN_IF_ERROR(Grow(backend_, send_unperm_, n * i32));
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

absl::Status ExpertDispatch::PlanSend(const int32_t* ids, int64_t t) {
  const int64_t e_count = shape_.num_experts, a = t * shape_.top_k;
  const size_t n = placement_->experts_of.size(), m = static_cast<size_t>(max_local_);
  host_offsets_.assign(static_cast<size_t>(e_count + 1), 0);
  if (a > 0) {
    // Sorted by expert, token order within: the same plan as on one rank, on the device.
    backend_->PlanRouting(ids, t, shape_.top_k, e_count, plan_offsets_.as<int64_t>(), gather_rows_.as<int32_t>(),
                          combine_rows_.as<int32_t>());
    // The layer's one copy to the host: how many rows each expert gets.
    RETURN_IF_ERROR(backend_->CopyToHost(host_offsets_.data(), plan_offsets_.data(), host_offsets_.size() * sizeof(int64_t)));
  }
  send_counts_.assign(n * m, 0);
  send_rows_.assign(n, 0);
  for (size_t p = 0; p < n; ++p) {
    for (size_t i = 0; i < placement_->experts_of[p].size(); ++i) {
      const auto [begin, end] = RowsFor(placement_->experts_of[p][i], p);
      send_counts_[p * m + i] = end - begin;
      send_rows_[p] += send_counts_[p * m + i];
    }
  }
  if (placement_->rank_major || a == 0) return absl::OkStatus();
  // The placement interleaves the ranks' experts (or splits an expert's rows among its copies):
  // send row j is sorted row host_perm_[j], so that each peer's rows are contiguous (its
  // experts in order), and comes back to it.
  host_perm_.resize(static_cast<size_t>(a));
  host_unperm_.resize(static_cast<size_t>(a));
  int32_t j = 0;
  for (size_t p = 0; p < n; ++p) {
    for (int32_t e : placement_->experts_of[p]) {
      const auto [begin, end] = RowsFor(e, p);
      for (int64_t s = begin; s < end; ++s, ++j) {
        host_perm_[j] = static_cast<int32_t>(s);
        host_unperm_[s] = j;
      }
    }
  }
  RETURN_IF_ERROR(backend_->CopyToDevice(send_perm_.data(), host_perm_.data(), a * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(send_unperm_.data(), host_unperm_.data(), a * sizeof(int32_t)));
  // Composed on the device, so the rows move once each way as under a contiguous placement:
  // send row j is token gather_rows[perm[j]], and assignment i's result comes back at send row
  // unperm[combine_rows[i]].
  backend_->ComposeIndices(gather_rows_.as<int32_t>(), send_perm_.as<int32_t>(), a, send_perm_.as<int32_t>());
  backend_->ComposeIndices(send_unperm_.as<int32_t>(), combine_rows_.as<int32_t>(), a, combine_rows_.as<int32_t>());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ExpertDispatch::PlanReceive(ExpertDispatchStats* stats) {
  const size_t n = placement_->experts_of.size(), m = static_cast<size_t>(max_local_);
  const std::vector<int32_t>& mine = placement_->experts_of[static_cast<size_t>(ep_->rank())];
  const int64_t e_count = shape_.num_experts;
  // Rows arrive peer by peer, each peer's sorted by expert (its counts say how many of each).
  recv_rows_.assign(n, 0);
  host_group_offsets_.assign(static_cast<size_t>(e_count + 1), 0);
  for (size_t p = 0; p < n; ++p) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const int64_t c = recv_counts_[p * m + i];
      if (c < 0) return absl::InternalError(absl::StrCat("expert parallel: rank ", p, " sends ", c, " rows"));
      recv_rows_[p] += c;
      host_group_offsets_[mine[i] + 1] += c;
    }
  }
  if (stats != nullptr && static_cast<int64_t>(stats->expert_rows.size()) != e_count) stats->expert_rows.assign(e_count, 0);
  for (int64_t e = 0; e < e_count; ++e) {
    if (stats != nullptr) {
      stats->expert_rows[e] += host_group_offsets_[e + 1];
      if (host_group_offsets_[e + 1] > 0) ++stats->experts_hit;
    }
    host_group_offsets_[e + 1] += host_group_offsets_[e];
  }
  const int64_t r_total = host_group_offsets_.back();
  RETURN_IF_ERROR(EnsureReceiveRows(std::max<int64_t>(r_total, 1)));
  if (r_total == 0) return r_total;
  // The grouped GEMMs want them expert by expert (peer order within): received row r is
  // expert-order row sorted_of[r]; perm is its inverse.
  std::vector<int64_t> cursor(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) cursor[i] = host_group_offsets_[mine[i]];
  std::vector<int32_t> sorted_of(r_total), perm(r_total);
  int64_t r = 0;
  for (size_t p = 0; p < n; ++p) {
    for (size_t i = 0; i < mine.size(); ++i) {
      for (int64_t c = 0; c < recv_counts_[p * m + i]; ++c, ++r) {
        sorted_of[r] = static_cast<int32_t>(cursor[i]++);
        perm[sorted_of[r]] = static_cast<int32_t>(r);
      }
    }
  }
  RETURN_IF_ERROR(backend_->CopyToDevice(perm_.data(), perm.data(), r_total * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(unperm_.data(), sorted_of.data(), r_total * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(offsets_.data(), host_group_offsets_.data(),
                                         host_group_offsets_.size() * sizeof(int64_t)));
  return r_total;
}

absl::Status ExpertDispatch::Run(int64_t layer, const float* xn, const int32_t* ids, const float* weights, int64_t t,
                                 std::span<const WeightRef> w13, std::span<const WeightRef> w2, float* x,
                                 ExpertDispatchStats* stats) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("expert dispatch: layer ", layer, " of ", layers_.size()));
  }
  placement_ = &layers_[static_cast<size_t>(layer)];
  const int64_t h = shape_.hidden, k = shape_.top_k;
  const CommStats before = ep_->stats();
  const int64_t a = t * k;  // (token, slot) assignments of this rank's tokens
  RETURN_IF_ERROR(EnsureSendRows(std::max<int64_t>(a, 1)));
  RETURN_IF_ERROR(PlanSend(ids, t));
  // Dispatch: the per-(peer, expert) counts, from which each receiver plans alone; then the rows.
  RETURN_IF_ERROR(Timed(stats, [&] { return ep_->AllToAllCounts(send_counts_, &recv_counts_); }));
  ASSIGN_OR_RETURN(const int64_t r_total, PlanReceive(stats));
  float* send = send_x_.as<float>();
  if (a > 0) backend_->GatherRows(xn, (placement_->rank_major ? gather_rows_ : send_perm_).as<int32_t>(), a, h, send);
  if (bf16_rows_ && a > 0) backend_->RoundToBf16(send, a * h, send_bf16_.as<uint16_t>());
  RETURN_IF_ERROR(backend_->Synchronize());  // the communicator reads what the compute stream wrote
  const int64_t row_bytes = h * static_cast<int64_t>(sizeof(float));
  if (bf16_rows_) {
    const int64_t wire_bytes = h * static_cast<int64_t>(sizeof(uint16_t));
    RETURN_IF_ERROR(Timed(stats, [&] {
      return ep_->AllToAll(send_bf16_.data(), Scaled(send_rows_, wire_bytes), recv_bf16_.data(),
                           Scaled(recv_rows_, wire_bytes), Counts::kAgreed);
    }));
    if (r_total > 0) backend_->WidenBf16(recv_bf16_.as<uint16_t>(), r_total * h, recv_x_.as<float>());
  } else {
    RETURN_IF_ERROR(Timed(stats, [&] {
      return ep_->AllToAll(send, Scaled(send_rows_, row_bytes), recv_x_.data(), Scaled(recv_rows_, row_bytes),
                           Counts::kAgreed);
    }));
  }
  // Run this rank's experts on what it received, grouped by expert.
  float* back = in_.as<float>();  // free again once the first expert GEMM has read it
  if (r_total > 0) {
    const int64_t* offsets = offsets_.as<int64_t>();
    backend_->GatherRows(recv_x_.as<float>(), perm_.as<int32_t>(), r_total, h, in_.as<float>());
    backend_->GroupedSwiGluMlp(in_.as<float>(), w13, w2, offsets, r_total, shape_.intermediate, gate_up_.as<float>(),
                               act_.as<float>(), out_.as<float>());
    backend_->GatherRows(out_.as<float>(), unperm_.as<int32_t>(), r_total, h, back);
  }
  // Results go back the way they came (into send order), then combine as on one rank.
  RETURN_IF_ERROR(backend_->Synchronize());
  float* results = results_.as<float>();
  RETURN_IF_ERROR(Timed(stats, [&] {
    return ep_->AllToAll(back, Scaled(recv_rows_, row_bytes), results, Scaled(send_rows_, row_bytes), Counts::kAgreed);
  }));
  if (stats != nullptr) {
    const CommStats after = ep_->stats();
    stats->comm_seconds += after.seconds - before.seconds;
    stats->comm_bytes += after.bytes_sent - before.bytes_sent;
    stats->comm_bytes_outside += OutsideBytes(bf16_rows_ ? h * static_cast<int64_t>(sizeof(uint16_t)) : row_bytes, row_bytes);
    stats->assignments += a;
  }
  if (t == 0) return absl::OkStatus();
  backend_->ScatterCombine(results, combine_rows_.as<int32_t>(), weights, t, k, h, x, /*accumulate=*/true);
  return absl::OkStatus();
}

}  // namespace moeserve
