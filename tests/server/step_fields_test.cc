// The step field list against what leaves the engine: every StepSummary field of GetStats is
// named by the list with a matching type, and a record whose fields all hold different values
// comes out at the paths and in the units the trace's readers and the proto document (written
// out by hand here, not derived from the list).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "engine/step_fields.h"
#include "engine/trace_writer.h"
#include "server/step_summary.h"

namespace moeserve {
namespace {

using google::protobuf::FieldDescriptor;

// A record whose every field differs: int64 fields 1, 2, 3, ..., double fields 0.5, 1.5, ...
StepRecord Distinct() {
  StepRecord r;
  int64_t whole = 0;
  double half = 0.5;
  for (const StepField& f : StepFields()) {
    if (const auto* m = std::get_if<int64_t StepRecord::*>(&f.member)) r.*(*m) = ++whole;
    if (const auto* m = std::get_if<double StepRecord::*>(&f.member)) r.*(*m) = half++;
  }
  r.expert_tokens = {7, 0, 9};
  return r;
}

TEST(StepFieldsTest, EveryStepSummaryFieldIsListedWithItsType) {
  const auto* desc = v1::StepSummary::descriptor();
  std::set<std::string> listed;
  for (const StepField& f : StepFields()) {
    if (*f.summary_name == '\0') continue;
    EXPECT_TRUE(listed.insert(f.summary_name).second) << f.summary_name << " listed twice";
    const FieldDescriptor* fd = desc->FindFieldByName(f.summary_name);
    ASSERT_NE(fd, nullptr) << f.summary_name << " is not a StepSummary field";
    if (std::holds_alternative<std::vector<int64_t> StepRecord::*>(f.member)) {
      EXPECT_TRUE(fd->is_repeated() && fd->cpp_type() == FieldDescriptor::CPPTYPE_INT64) << f.summary_name;
    } else {
      EXPECT_FALSE(fd->is_repeated()) << f.summary_name;
      EXPECT_TRUE(fd->cpp_type() == FieldDescriptor::CPPTYPE_INT64 || fd->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE)
          << f.summary_name;
    }
  }
  for (int i = 0; i < desc->field_count(); ++i) {
    EXPECT_EQ(listed.count(desc->field(i)->name()), 1u) << "StepSummary." << desc->field(i)->name()
                                                        << " is filled by nothing: list it in engine/step_fields.cc";
  }
}

TEST(StepFieldsTest, TheSummaryCarriesTheRecordInItsUnits) {
  const StepRecord r = Distinct();
  v1::StepSummary s;
  FillStepSummary(r, &s);
  EXPECT_EQ(s.step(), r.step);
  EXPECT_EQ(s.num_seqs(), r.num_seqs);
  EXPECT_EQ(s.num_tokens(), r.num_tokens);
  EXPECT_DOUBLE_EQ(s.duration_ms(), r.duration_seconds * 1e3);
  EXPECT_EQ(s.prefill_tokens(), r.prefill_tokens);
  EXPECT_EQ(s.decode_tokens(), r.decode_tokens);
  EXPECT_EQ(s.experts_hit(), r.experts_hit);
  EXPECT_DOUBLE_EQ(s.attention_ms(), r.attention_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.moe_ms(), r.moe_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.sampling_ms(), r.sampling_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.predicted_ms(), r.predicted_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.predicted_bound_ms(), r.predicted_bound_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.weight_bytes(), r.weight_bytes);
  EXPECT_DOUBLE_EQ(s.kv_read_bytes(), r.kv_read_bytes);
  EXPECT_DOUBLE_EQ(s.flops(), r.flops);
  EXPECT_DOUBLE_EQ(s.comm_ms(), r.comm_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.comm_min_ms(), r.comm_min_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.comm_after_last_ms(), r.comm_after_last_seconds * 1e3);
  EXPECT_EQ(s.comm_bytes(), r.comm_bytes_observed);
  EXPECT_EQ(s.scale_out_bytes(), r.scale_out_bytes_observed);
  EXPECT_DOUBLE_EQ(s.predicted_scale_out_bytes(), r.scale_out_bytes);
  EXPECT_DOUBLE_EQ(s.predicted_comm_ms(), r.predicted_comm_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.expert_imbalance(), r.expert_imbalance);
  EXPECT_DOUBLE_EQ(s.rank_imbalance(), r.rank_imbalance);
  EXPECT_DOUBLE_EQ(s.attention_imbalance(), r.attention_imbalance);
  ASSERT_EQ(s.expert_tokens_size(), 3);
  EXPECT_EQ(s.expert_tokens(2), 9);
  EXPECT_DOUBLE_EQ(s.transfer_bytes(), r.transfer_bytes);
  EXPECT_DOUBLE_EQ(s.transfer_ms(), r.transfer_seconds * 1e3);
  EXPECT_DOUBLE_EQ(s.predicted_transfer_ms(), r.predicted_transfer_seconds * 1e3);
}

TEST(StepFieldsTest, TheTraceLineHoldsEveryFieldAtItsPath) {
  const StepRecord r = Distinct();
  const auto j = nlohmann::json::parse(TraceWriter::ToJsonLine(r));
  EXPECT_EQ(j["step"], r.step);
  EXPECT_EQ(j["start_s"], r.start_seconds);
  EXPECT_EQ(j["duration_s"], r.duration_seconds);
  EXPECT_EQ(j["num_seqs"], r.num_seqs);
  EXPECT_EQ(j["num_tokens"], r.num_tokens);
  EXPECT_EQ(j["prefill_tokens"], r.prefill_tokens);
  EXPECT_EQ(j["decode_tokens"], r.decode_tokens);
  EXPECT_EQ(j["context_tokens"], r.context_tokens);
  EXPECT_EQ(j["experts_hit"], r.experts_hit);
  EXPECT_EQ(j["preempted"], r.preempted);
  const auto& o = j["observed_s"];
  EXPECT_EQ(o["schedule"], r.schedule_seconds);
  EXPECT_EQ(o["attention"], r.attention_seconds);
  EXPECT_EQ(o["moe"], r.moe_seconds);
  EXPECT_EQ(o["head"], r.head_seconds);
  EXPECT_EQ(o["sampling"], r.sampling_seconds);
  EXPECT_EQ(o["comm"], r.comm_seconds);
  EXPECT_EQ(o["comm_min"], r.comm_min_seconds);
  EXPECT_EQ(o["comm_after_last"], r.comm_after_last_seconds);
  EXPECT_EQ(o["transfer"], r.transfer_seconds);
  EXPECT_EQ(j["flops"], r.flops);
  const auto& b = j["bytes"];
  EXPECT_EQ(b["weights"], r.weight_bytes);
  EXPECT_EQ(b["kv_read"], r.kv_read_bytes);
  EXPECT_EQ(b["kv_write"], r.kv_write_bytes);
  EXPECT_EQ(b["comm"], r.comm_bytes);
  EXPECT_EQ(b["comm_observed"], r.comm_bytes_observed);
  EXPECT_EQ(b["scale_out"], r.scale_out_bytes);
  EXPECT_EQ(b["scale_out_observed"], r.scale_out_bytes_observed);
  EXPECT_EQ(b["transfer"], r.transfer_bytes);
  EXPECT_EQ(j["expert_tokens"], nlohmann::json::array({7, 0, 9}));
  EXPECT_EQ(j["expert_imbalance"], r.expert_imbalance);
  EXPECT_EQ(j["rank_imbalance"], r.rank_imbalance);
  EXPECT_EQ(j["attention_imbalance"], r.attention_imbalance);
  const auto& p = j["predicted_s"];
  EXPECT_EQ(p["compute"], r.predicted_compute_seconds);
  EXPECT_EQ(p["memory"], r.predicted_memory_seconds);
  EXPECT_EQ(p["comm"], r.predicted_comm_seconds);
  EXPECT_EQ(p["transfer"], r.predicted_transfer_seconds);
  EXPECT_EQ(p["bound"], r.predicted_bound_seconds);
  EXPECT_EQ(p["total"], r.predicted_seconds);
  EXPECT_DOUBLE_EQ(j["observed_over_predicted"].get<double>(), r.duration_seconds / r.predicted_seconds);
  // Nothing else: 15 top-level values besides the 3 groups and the ratio.
  EXPECT_EQ(j.size(), 15u + 3u + 1u) << j.dump();
  EXPECT_EQ(o.size(), 9u);
  EXPECT_EQ(b.size(), 8u);
  EXPECT_EQ(p.size(), 6u);
}

}  // namespace
}  // namespace moeserve
