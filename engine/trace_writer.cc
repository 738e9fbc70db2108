// Step traces.
#include "engine/trace_writer.h"

#include <cerrno>
#include <cstring>
#include <variant>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "engine/step_fields.h"

namespace moeserve {

TraceWriter::~TraceWriter() { Close(); }

absl::Status TraceWriter::Open(const std::string& jsonl_path, const std::string& chrome_path) {
  Close();
  if (!jsonl_path.empty()) {
    jsonl_ = std::fopen(jsonl_path.c_str(), "w");
    if (jsonl_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--trace-jsonl: cannot create ", jsonl_path, ": ", strerror(errno)));
    }
  }
  if (!chrome_path.empty()) {
    chrome_ = std::fopen(chrome_path.c_str(), "w");
    if (chrome_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--trace-chrome: cannot create ", chrome_path, ": ", strerror(errno)));
    }
    // The array format tolerates a missing closing bracket, so a killed server leaves a
    // loadable trace; Close writes it when it can.
    std::fputs("[\n", chrome_);
    first_event_ = true;
  }
  return absl::OkStatus();
}

std::string TraceWriter::ToJsonLine(const StepRecord& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const StepField& f : StepFields()) {
    nlohmann::json& at = *f.trace_group ? j[f.trace_group][f.trace_name] : j[f.trace_name];
    std::visit([&](auto member) { at = r.*member; }, f.member);
  }
  j["observed_over_predicted"] = r.observed_over_predicted();
  return j.dump();
}

void TraceWriter::Write(const StepRecord& r, int64_t kv_blocks_used) {
  if (jsonl_ != nullptr) {
    const std::string line = ToJsonLine(r);
    std::fprintf(jsonl_, "%s\n", line.c_str());
    std::fflush(jsonl_);  // a killed server keeps every whole step
  }
  if (chrome_ == nullptr) return;
  auto emit = [&](const nlohmann::json& ev) {
    std::fprintf(chrome_, "%s%s", first_event_ ? "" : ",\n", ev.dump().c_str());
    first_event_ = false;
  };
  const double ts = r.start_seconds * 1e6;  // microseconds
  emit({{"name", "step"},
        {"cat", "engine"},
        {"ph", "X"},
        {"ts", ts},
        {"dur", r.duration_seconds * 1e6},
        {"pid", 1},
        {"tid", 1},
        {"args",
         {{"step", r.step},
          {"seqs", r.num_seqs},
          {"prefill_tokens", r.prefill_tokens},
          {"decode_tokens", r.decode_tokens},
          {"experts_hit", r.experts_hit},
          {"predicted_ms", r.predicted_seconds * 1e3},
          {"observed_over_predicted", r.observed_over_predicted()}}}});
  // Phases interleave layer by layer; they are drawn back to back with their summed times.
  double at = ts;
  for (auto [name, secs] : {std::pair<const char*, double>{"schedule", r.schedule_seconds},
                            {"attention", r.attention_seconds},
                            {"moe", r.moe_seconds},
                            {"head", r.head_seconds},
                            {"sampling", r.sampling_seconds}}) {
    if (secs <= 0) continue;
    emit({{"name", name}, {"cat", "phase"}, {"ph", "X"}, {"ts", at}, {"dur", secs * 1e6}, {"pid", 1}, {"tid", 1}});
    at += secs * 1e6;
  }
  emit({{"name", "batch"},
        {"ph", "C"},
        {"ts", ts},
        {"pid", 1},
        {"args", {{"seqs", r.num_seqs}, {"tokens", r.num_tokens}}}});
  emit({{"name", "kv_blocks_used"}, {"ph", "C"}, {"ts", ts}, {"pid", 1}, {"args", {{"blocks", kv_blocks_used}}}});
  if (r.predicted_seconds > 0) {
    emit({{"name", "observed_over_predicted"},
          {"ph", "C"},
          {"ts", ts},
          {"pid", 1},
          {"args", {{"ratio", r.observed_over_predicted()}}}});
  }
  std::fflush(chrome_);
}

void TraceWriter::Close() {
  if (jsonl_ != nullptr) {
    std::fclose(jsonl_);
    jsonl_ = nullptr;
  }
  if (chrome_ != nullptr) {
    std::fputs("\n]\n", chrome_);
    std::fclose(chrome_);
    chrome_ = nullptr;
  }
}

}  // namespace moeserve
