#include "tools/vllm_eplb.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve::tools {
namespace {

using nlohmann::json;

// A positive (or, for num_redundant_experts, non-negative) integer key of --eplb-config.
absl::StatusOr<int64_t> Count(const json& j, const char* key, int64_t least) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eplb-config: \"", key, "\" must be an integer >= ", least, ", got ", v.dump()));
  }
  return v.get<int64_t>();
}

struct Eplb {
  int64_t interval = kVllmEplbStepInterval, window = kVllmEplbWindowSize, redundant = -1;
};

absl::Status ReadConfig(const std::string& text, Eplb* e) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--eplb-config must be a JSON object, got '", text, "'"));
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "window_size") {
      ASSIGN_OR_RETURN(e->window, Count(j, "window_size", 1));
    } else if (key == "step_interval") {
      ASSIGN_OR_RETURN(e->interval, Count(j, "step_interval", 1));
    } else if (key == "num_redundant_experts") {
      ASSIGN_OR_RETURN(e->redundant, Count(j, "num_redundant_experts", 0));
    } else if (key == "log_balancedness" || key == "use_async") {
      if (!value.is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat("--eplb-config: \"", key, "\" must be true or false"));
      }
    } else if (key == "log_balancedness_interval") {
      RETURN_IF_ERROR(Count(j, "log_balancedness_interval", 1).status());
    } else if (key == "policy") {
      if (value != "default") {
        return absl::InvalidArgumentError(absl::StrCat("--eplb-config: policy ", value.dump(),
                                                       ": moeserve re-places by its balanced rule only "
                                                       "(\"default\", parallel/placement.h)"));
      }
    } else if (key == "communicator") {
      if (!value.is_null()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--eplb-config: communicator ", value.dump(),
            ": moeserve's thread ranks copy experts from a peer through host memory and its process ranks read them "
            "from the checkpoint; there is no communicator to choose"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--eplb-config: unknown key \"", key,
                                                     "\" (moeserve reads window_size, step_interval, "
                                                     "num_redundant_experts, log_balancedness, "
                                                     "log_balancedness_interval, use_async, policy, communicator)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyVllmEplb(const VllmFlags& f, EngineFlags* engine) {
  if (!f.enable_eplb) {
    if (!f.eplb_config.empty()) return absl::InvalidArgumentError("--eplb-config needs --enable-eplb");
    if (f.num_redundant_experts > 0) {
      return absl::InvalidArgumentError(
          "--num-redundant-experts needs --enable-eplb (or moeserve's --expert-replicas with a recorded load)");
    }
    return absl::OkStatus();
  }
  Eplb e;
  if (!f.eplb_config.empty()) RETURN_IF_ERROR(ReadConfig(f.eplb_config, &e));
  if (f.num_redundant_experts >= 0) {
    if (e.redundant >= 0 && e.redundant != f.num_redundant_experts) {
      return absl::InvalidArgumentError(absl::StrCat("--num-redundant-experts ", f.num_redundant_experts,
                                                     " and --eplb-config num_redundant_experts ", e.redundant,
                                                     " disagree"));
    }
    e.redundant = f.num_redundant_experts;
  }
  ParallelConfig& p = engine->config.parallel;
  if (p.ep < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--enable-eplb balances experts over EP ranks: add -tp N --enable-expert-parallel (or --ep N) with N >= 2, "
        "got ", p.ep, " rank"));
  }
  if (p.eplb_interval > 0 && p.eplb_interval != e.interval) {
    return absl::InvalidArgumentError(absl::StrCat("--enable-eplb's step interval ", e.interval,
                                                   " and --eplb-interval ", p.eplb_interval, " disagree"));
  }
  // moeserve's own flags, where given (not their defaults), must say the same.
  if (e.redundant >= 0 && p.expert_replicas > 0 && p.expert_replicas != e.redundant) {
    return absl::InvalidArgumentError(absl::StrCat("--num-redundant-experts ", e.redundant, " and --expert-replicas ",
                                                   p.expert_replicas, " disagree"));
  }
  if (p.eplb_window != ParallelConfig().eplb_window && p.eplb_window != e.window) {
    return absl::InvalidArgumentError(absl::StrCat("--enable-eplb's window ", e.window, " steps and --eplb-window ",
                                                   p.eplb_window, " disagree"));
  }
  p.eplb_interval = e.interval;
  p.eplb_window = e.window;
  if (e.redundant > 0) p.expert_replicas = e.redundant;
  return absl::OkStatus();
}

}  // namespace moeserve::tools
