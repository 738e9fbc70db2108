// StepSummary from the step field list.
#include "server/step_summary.h"

#include <variant>

#include "engine/step_fields.h"

namespace moeserve {
namespace {

using google::protobuf::FieldDescriptor;

void SetScalar(const FieldDescriptor* fd, double value, int64_t whole, google::protobuf::Message* m) {
  const auto* refl = m->GetReflection();
  if (fd->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
    refl->SetInt64(m, fd, whole);
  } else {
    refl->SetDouble(m, fd, value);
  }
}

}  // namespace

void FillStepSummary(const StepRecord& r, v1::StepSummary* out) {
  const auto* desc = out->GetDescriptor();
  for (const StepField& f : StepFields()) {
    if (*f.summary_name == '\0') continue;
    // server_test holds every name to a StepSummary field of a matching type.
    const FieldDescriptor* fd = desc->FindFieldByName(f.summary_name);
    if (fd == nullptr) continue;
    if (const auto* list = std::get_if<std::vector<int64_t> StepRecord::*>(&f.member)) {
      for (int64_t v : r.**list) out->GetReflection()->AddInt64(out, fd, v);
    } else if (const auto* whole = std::get_if<int64_t StepRecord::*>(&f.member)) {
      SetScalar(fd, static_cast<double>(r.**whole) * f.summary_scale, r.**whole, out);
    } else {
      const double v = r.*std::get<double StepRecord::*>(f.member);
      SetScalar(fd, v * f.summary_scale, static_cast<int64_t>(v), out);
    }
  }
}

}  // namespace moeserve
