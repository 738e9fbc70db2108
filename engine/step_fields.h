// Every field of a StepRecord that leaves the engine, listed once: the JSONL trace
// (trace_writer.cc, which `bench --trace-jsonl` and explore --measure read) and GetStats'
// StepSummary (server/step_summary.cc, by field name through protobuf reflection) are filled
// from this list. A new field is a member in step_record.h and one line in step_fields.cc (and a
// proto field to reach GetStats; server_test holds the list and the proto to each other).
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "engine/step_record.h"

namespace moeserve {

struct StepField {
  using Member =
      std::variant<int64_t StepRecord::*, double StepRecord::*, std::vector<int64_t> StepRecord::*>;
  const char* trace_group;    // "" (top level), "observed_s", "bytes" or "predicted_s"
  const char* trace_name;
  const char* summary_name;   // StepSummary's field; "" where GetStats leaves it out
  double summary_scale;       // the summary's unit over the record's (seconds -> ms: 1e3)
  Member member;
};

const std::vector<StepField>& StepFields();

}  // namespace moeserve
