// Scheduling class names (see priority.h).
#include "engine/priority.h"

#include "absl/strings/str_cat.h"

namespace moeserve {

namespace {
constexpr Priority kAll[] = {Priority::kFast, Priority::kHigh, Priority::kNormal, Priority::kLow};
}  // namespace

const char* PriorityName(Priority p) {
  switch (p) {
    case Priority::kFast:
      return "fast";
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kLow:
      return "low";
  }
  return "?";
}

absl::StatusOr<Priority> PriorityFromName(absl::string_view name) {
  for (Priority p : kAll) {
    if (name == PriorityName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("priority: must be fast, high, normal or low, got \"", name, "\""));
}

}  // namespace moeserve
