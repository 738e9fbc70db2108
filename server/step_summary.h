// GetStats' StepSummary of one engine step, filled from engine/step_fields.h's list by field
// name (protobuf reflection), so a StepRecord field reaches GetStats without code here.
#pragma once

#include "engine/step_record.h"
#include "server/proto/moeserve.pb.h"

namespace moeserve {

void FillStepSummary(const StepRecord& r, v1::StepSummary* out);

}  // namespace moeserve
