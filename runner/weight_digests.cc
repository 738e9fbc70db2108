// ShareWeightDigests: process ranks that each read their shard of the checkpoint exchange the
// digests of what they read, so that every rank's fingerprint is the whole model's (and a
// re-placement can check the experts it reads later against them).
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "runner/parallel_executor.h"

namespace moeserve {

absl::Status ShareWeightDigests(ProcessRanks* ranks, ModelWeights* weights) {
  std::string mine;  // (key length, key, digest) for every weight read here
  for (const auto& [key, digest] : weights->tensor_digests()) {
    const uint64_t n = key.size();
    mine.append(reinterpret_cast<const char*>(&n), sizeof(n));
    mine.append(key);
    mine.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> all, ranks->AllGatherBytes(mine));
  std::map<std::string, uint64_t> merged;
  for (const std::string& part : all) {
    for (size_t at = 0; at < part.size();) {
      uint64_t n = 0, digest = 0;
      if (part.size() - at < sizeof(n)) return absl::InternalError("weight digests: truncated");
      std::memcpy(&n, part.data() + at, sizeof(n));
      at += sizeof(n);
      if (part.size() - at < n + sizeof(digest)) return absl::InternalError("weight digests: truncated");
      std::string key = part.substr(at, n);
      at += n;
      std::memcpy(&digest, part.data() + at, sizeof(digest));
      at += sizeof(digest);
      // Ranks that read the same weight must have read the same bytes: else the hosts hold
      // different checkpoints, and the job would compute a model that is not the checkpoint.
      auto [it, fresh] = merged.emplace(std::move(key), digest);
      if (!fresh && it->second != digest) {
        std::string name = it->first;
        for (char& c : name) c = c == '\0' ? ' ' : c;
        return absl::FailedPreconditionError(
            absl::StrCat("weight digests: ranks read different bytes for \"", name,
                         "\": the hosts hold different checkpoints"));
      }
    }
  }
  weights->MergeTensorDigests(merged);
  return absl::OkStatus();
}

}  // namespace moeserve
