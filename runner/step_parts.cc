// Writing a step into its ranks' sub-steps (see step_parts.h).
#include "runner/step_parts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

// The edits of logit row `from` (edits are row-ordered), renumbered as row `to` of `out`.
void MoveRowEdits(const std::vector<LogitEdit>& edits, int64_t from, int64_t to, std::vector<LogitEdit>* out) {
  auto lo = std::lower_bound(edits.begin(), edits.end(), from,
                             [](const LogitEdit& e, int64_t row) { return e.row < row; });
  for (; lo != edits.end() && lo->row == from; ++lo) {
    out->push_back(*lo);
    out->back().row = static_cast<int32_t>(to);
  }
}

absl::Status CheckFlat(const ForwardInput& in) {
  const size_t t = in.token_ids.size();
  if (in.num_seqs < 0 || in.max_blocks_per_seq < 0 ||
      static_cast<int64_t>(in.block_tables.size()) != in.num_seqs * in.max_blocks_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat("step: block_tables has ", in.block_tables.size(),
                                                   " entries, not num_seqs x max_blocks_per_seq = ", in.num_seqs,
                                                   " x ", in.max_blocks_per_seq));
  }
  if (in.positions.size() != t || in.token_seq.size() != t) {
    return absl::InvalidArgumentError("step: token_ids, positions and token_seq differ in length");
  }
  for (int32_t j : in.token_seq) {
    if (j < 0 || j >= in.num_seqs) return absl::InvalidArgumentError(absl::StrCat("step: token_seq ", j, " out of range"));
  }
  for (int32_t r : in.logit_rows) {
    if (r < 0 || static_cast<size_t>(r) >= t) {
      return absl::InvalidArgumentError(absl::StrCat("step: logit row at token ", r, " of ", t));
    }
  }
  if (!in.sample.empty() && in.sample.size() != in.logit_rows.size()) {
    return absl::InvalidArgumentError("step: one sampling spec per logit row, or none");
  }
  return absl::OkStatus();
}

}  // namespace

StepCut StepCut::One(int64_t num_blocks, int64_t block_size) {
  StepCut c;
  c.block_size = block_size;
  c.segment_begin = {0, num_blocks};
  return c;
}

int64_t StepCut::RankOf(int32_t block) const {
  const auto after = std::upper_bound(segment_begin.begin() + 1, segment_begin.end() - 1, block);
  return after - segment_begin.begin() - 1;
}

StepWriter::StepWriter(const StepCut& cut, const std::vector<int64_t>& seq_ranks) : cut_(cut) {
  const int64_t ranks = cut.ranks(), micro = cut.micro_batches;
  out_.parts.assign(ranks, std::vector<SubStep>(micro));
  std::vector<int64_t> count(ranks, 0), seen(ranks, 0);
  for (int64_t e : seq_ranks) ++count[std::clamp<int64_t>(e, 0, ranks - 1)];
  seqs_.resize(seq_ranks.size());
  for (size_t j = 0; j < seq_ranks.size(); ++j) {
    Seq& s = seqs_[j];
    s.rank = std::clamp<int64_t>(seq_ranks[j], 0, ranks - 1);
    // The q-th of n sequences goes to micro-batch m where n m / micro <= q < n (m + 1) / micro.
    const int64_t q = seen[s.rank]++, n = count[s.rank];
    while (n * (s.micro + 1) / micro <= q) ++s.micro;
    s.local = q - n * s.micro / micro;
  }
}

SubStep& StepWriter::Current() {
  const Seq& s = seqs_[next_ - 1];
  return out_.parts[s.rank][s.micro];
}

StepWriter::Seq* StepWriter::Active(const char* what) {
  if (next_ == 0 || !misuse_.empty()) {
    if (misuse_.empty()) misuse_ = absl::StrCat(what, " before any sequence");
    return nullptr;
  }
  return &seqs_[next_ - 1];
}

void StepWriter::BeginSequence(std::span<const int32_t> blocks) {
  if (next_ == static_cast<int64_t>(seqs_.size())) {
    if (misuse_.empty()) misuse_ = absl::StrCat("sequence ", next_ + 1, " of ", seqs_.size(), " announced");
    return;
  }
  Seq& s = seqs_[next_++];
  s.blocks.assign(blocks.begin(), blocks.end());
  ++Current().in.num_seqs;
  ++out_.num_seqs;
}

void StepWriter::AddToken(int32_t token, int32_t position) {
  Seq* active = Active("a token");
  if (active == nullptr) return;
  Seq& s = *active;
  ForwardInput& in = Current().in;
  const int64_t bs = cut_.block_size, b = position / bs;
  s.reach = std::max(s.reach, b + 1);
  const int64_t block = b < static_cast<int64_t>(s.blocks.size()) ? s.blocks[b] - cut_.segment_begin[s.rank] : -1;
  in.token_ids.push_back(token);
  in.positions.push_back(position);
  in.token_seq.push_back(static_cast<int32_t>(s.local));
  in.slots.push_back(block * bs + position % bs);
  ++s.tokens;
  ++out_.num_tokens;
}

int32_t StepWriter::AddLogitRow(int64_t dest, const SampleSpec* spec) {
  Seq* s = Active("a logit row");
  if (s != nullptr && s->tokens == 0 && misuse_.empty()) misuse_ = "a logit row before the sequence's first token";
  if (!misuse_.empty()) return 0;
  SubStep& sub = Current();
  sub.in.logit_rows.push_back(static_cast<int32_t>(sub.in.token_ids.size() - 1));
  sub.logit_dest.push_back(dest);
  if (spec != nullptr) {
    sub.in.sample.push_back(*spec);
    ++with_spec_;
  } else {
    ++without_spec_;
  }
  ++out_.num_logit_rows;
  return static_cast<int32_t>(sub.in.logit_rows.size() - 1);
}

std::vector<LogitEdit>* StepWriter::edits() {
  // Out of order, the edits go nowhere that is read (Finish refuses the step).
  return Active("edits") != nullptr ? &Current().in.logit_edits : &discarded_edits_;
}

absl::StatusOr<StepParts> StepWriter::Finish() {
  if (!misuse_.empty()) return absl::InvalidArgumentError(absl::StrCat("step: ", misuse_));
  if (next_ != static_cast<int64_t>(seqs_.size())) {
    return absl::InternalError(absl::StrCat("step: ", seqs_.size(), " sequences announced, ", next_, " written"));
  }
  if (with_spec_ > 0 && without_spec_ > 0) return absl::InvalidArgumentError("step: some logit rows lack a sampling spec");
  for (size_t j = 0; j < seqs_.size(); ++j) {
    const Seq& s = seqs_[j];
    const int64_t begin = cut_.segment_begin[s.rank], end = cut_.segment_begin[s.rank + 1];
    if (s.reach > static_cast<int64_t>(s.blocks.size())) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", j, "'s tokens reach block ", s.reach - 1,
                                                     " of a table of ", s.blocks.size()));
    }
    for (int64_t b = 0; b < s.reach; ++b) {
      if (s.blocks[b] < begin || s.blocks[b] >= end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step: sequence ", j, " runs on EP rank ", s.rank, " but its block ", b, " is ", s.blocks[b],
            ", outside that rank's pool segment [", begin, ", ", end, ")"));
      }
    }
    ForwardInput& in = out_.parts[s.rank][s.micro].in;
    in.max_blocks_per_seq = std::max<int64_t>(in.max_blocks_per_seq, s.blocks.size());
  }
  // Rows in each sub-step's order (its sequences were begun in that order); blocks past what
  // the tokens reach stay 0, so a table's padding never names another arena's block.
  for (const Seq& s : seqs_) {
    ForwardInput& in = out_.parts[s.rank][s.micro].in;
    for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) {
      in.block_tables.push_back(b < s.reach ? static_cast<int32_t>(s.blocks[b] - cut_.segment_begin[s.rank]) : 0);
    }
  }
  out_.sampling = with_spec_ > 0;
  out_.logits_to_host = logits_to_host_;
  for (auto& rank : out_.parts) {
    for (SubStep& sub : rank) sub.in.logits_to_host = logits_to_host_;
  }
  return std::move(out_);
}

absl::Status CheckLogitRows(const StepParts& step) {
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(step.num_logit_rows, 0)), false);
  for (const auto& rank : step.parts) {
    for (const SubStep& sub : rank) {
      if (sub.logit_dest.size() != sub.in.logit_rows.size() ||
          sub.in.sample.size() != (step.sampling ? sub.in.logit_rows.size() : 0)) {
        return absl::InvalidArgumentError("step: a part's logit rows, destinations and sampling specs disagree");
      }
      for (int64_t d : sub.logit_dest) {
        if (d < 0 || d >= step.num_logit_rows || seen[d]) {
          return absl::InvalidArgumentError(absl::StrCat("step: logit row destination ", d, " out of range or repeated (",
                                                         step.num_logit_rows, " rows)"));
        }
        seen[d] = true;
      }
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    return absl::InvalidArgumentError("step: a logit row destination is never written");
  }
  return absl::OkStatus();
}

absl::StatusOr<StepParts> CutStep(const ForwardInput& flat, const StepCut& cut) {
  RETURN_IF_ERROR(CheckFlat(flat));
  const int64_t width = flat.max_blocks_per_seq;
  std::vector<std::vector<int64_t>> seq_tokens(flat.num_seqs);
  for (int64_t i = 0; i < flat.num_tokens(); ++i) seq_tokens[flat.token_seq[i]].push_back(i);
  std::vector<int64_t> logit_of_token(flat.num_tokens(), -1);
  for (size_t r = 0; r < flat.logit_rows.size(); ++r) logit_of_token[flat.logit_rows[r]] = static_cast<int64_t>(r);
  std::vector<int64_t> ranks(flat.num_seqs, 0);
  for (int64_t j = 0; j < flat.num_seqs; ++j) ranks[j] = width > 0 ? cut.RankOf(flat.block_tables[j * width]) : 0;
  StepWriter w(cut, ranks);
  if (flat.logits_to_host) w.RequestLogitsToHost();
  for (int64_t j = 0; j < flat.num_seqs; ++j) {
    w.BeginSequence(std::span<const int32_t>(flat.block_tables.data() + j * width, width));
    for (int64_t i : seq_tokens[j]) {
      w.AddToken(flat.token_ids[i], flat.positions[i]);
      const int64_t r = logit_of_token[i];
      if (r < 0) continue;
      const int32_t local = w.AddLogitRow(r, flat.sample.empty() ? nullptr : &flat.sample[r]);
      MoveRowEdits(flat.logit_edits, r, local, w.edits());
    }
  }
  return w.Finish();
}

}  // namespace moeserve
