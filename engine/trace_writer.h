// Writes every StepRecord as it happens: one JSON object per line (JSONL), and a Chrome /
// Perfetto trace (JSON array format, loadable in chrome://tracing or ui.perfetto.dev) with one
// slice per step, its phases nested in it, and counters for batch size and KV blocks.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "engine/step_record.h"

namespace moeserve {

class TraceWriter {
 public:
  TraceWriter() = default;
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Either path may be empty. Files are created (truncated) now.
  absl::Status Open(const std::string& jsonl_path, const std::string& chrome_path);
  bool enabled() const { return jsonl_ != nullptr || chrome_ != nullptr; }
  // `kv_blocks_used` is drawn as a counter next to the step.
  void Write(const StepRecord& r, int64_t kv_blocks_used);
  // Flushes and closes (also done by the destructor).
  void Close();

  static std::string ToJsonLine(const StepRecord& r);

 private:
  std::FILE* jsonl_ = nullptr;
  std::FILE* chrome_ = nullptr;
  bool first_event_ = true;
};

}  // namespace moeserve
