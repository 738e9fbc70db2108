// Hardware profiles and presets.
#include "roofline/hardware.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"

namespace moeserve::roofline {

double HardwareProfile::PeakFlops(const std::string& weight_dtype) const {
  if (weight_dtype == "f32" && peak_flops_f32 > 0) return peak_flops_f32;
  return peak_flops_bf16;
}

void UseThreadRankExchanges(HardwareProfile* hw) {
  hw->empty_exchanges_free = false;
  hw->interconnect_latency_after_sweep.clear();
}

double HardwareProfile::MemBandwidthWithActive(int64_t active) const {
  if (ranks_sharing_memory <= 1 || solo_mem_bandwidth <= 0 || active >= ranks_sharing_memory) return mem_bandwidth;
  const double split = mem_bandwidth * static_cast<double>(ranks_sharing_memory) / static_cast<double>(std::max<int64_t>(active, 1));
  return std::max(mem_bandwidth, std::min(solo_mem_bandwidth, split));
}

double HardwareProfile::MemBandwidthAtThreads(int64_t threads) const {
  double bw = 0;
  for (const BandwidthAtThreads& b : mem_bandwidth_by_threads) {
    if (b.threads <= threads) bw = b.bytes_per_second;
  }
  return bw;
}

namespace {

using Sweeps = std::vector<HardwareProfile::LatencyAfterSweep>;

// The latency after streaming `bytes`: `idle` at 0, linear up to the first sweep, log-linear
// between sweeps, the largest sweep's beyond it.
double LatencyAfter(const Sweeps& s, double idle, double bytes) {
  if (s.empty() || !(bytes > 0)) return idle;
  if (bytes <= s.front().sweep_bytes) return idle + (s.front().latency - idle) * bytes / s.front().sweep_bytes;
  for (size_t i = 1; i < s.size(); ++i) {
    if (bytes <= s[i].sweep_bytes) {
      const double t = std::log(bytes / s[i - 1].sweep_bytes) / std::log(s[i].sweep_bytes / s[i - 1].sweep_bytes);
      return s[i - 1].latency + t * (s[i].latency - s[i - 1].latency);
    }
  }
  return s.back().latency;
}

absl::Status ValidateSweeps(const char* key, const Sweeps& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const double previous = i > 0 ? s[i - 1].sweep_bytes : 0;
    if (!(s[i].sweep_bytes > previous) || !std::isfinite(s[i].sweep_bytes) || !(s[i].latency >= 0) ||
        !std::isfinite(s[i].latency)) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: '", key, "' entry ", i, " needs sweep_bytes > ",
                                                     previous, " (ascending) and latency_s >= 0, got ", s[i].sweep_bytes,
                                                     " and ", s[i].latency));
    }
  }
  return absl::OkStatus();
}

void SweepsToJson(const char* key, const Sweeps& s, nlohmann::json* j) {
  if (s.empty()) return;
  nlohmann::json a = nlohmann::json::array();
  for (const auto& e : s) a.push_back({{"sweep_bytes", e.sweep_bytes}, {"latency_s", e.latency}});
  (*j)[key] = a;
}

absl::Status ParseSweeps(const nlohmann::json& j, const char* key, Sweeps* out) {
  if (!j.contains(key)) return absl::OkStatus();
  const nlohmann::json& a = j[key];
  const std::string shape =
      absl::StrCat("hardware profile: '", key, "' must be an array of {\"sweep_bytes\": number, \"latency_s\": number}");
  if (!a.is_array()) return absl::InvalidArgumentError(shape);
  for (const nlohmann::json& e : a) {
    if (!e.is_object() || !e.contains("sweep_bytes") || !e.contains("latency_s") || !e["sweep_bytes"].is_number() ||
        !e["latency_s"].is_number()) {
      return absl::InvalidArgumentError(shape);
    }
    out->push_back({e["sweep_bytes"].get<double>(), e["latency_s"].get<double>()});
  }
  return absl::OkStatus();
}

}  // namespace

double HardwareProfile::ScaleOutLatencyAfter(double bytes) const {
  return LatencyAfter(scale_out_latency_after_sweep, scale_out_latency, bytes);
}

double HardwareProfile::InterconnectLatencyAfter(double bytes) const {
  return LatencyAfter(interconnect_latency_after_sweep, interconnect_latency, bytes);
}

absl::Status HardwareProfile::Validate() const {
  auto positive = [](const char* key, double v) -> absl::Status {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: '", key, "' must be > 0, got ", v));
    }
    return absl::OkStatus();
  };
  for (auto [k, v] : {std::pair<const char*, double>{"peak_flops_bf16", peak_flops_bf16},
                      {"mem_bandwidth", mem_bandwidth},
                      {"mem_capacity", mem_capacity}}) {
    if (absl::Status s = positive(k, v); !s.ok()) return s;
  }
  for (auto [k, v] : {std::pair<const char*, double>{"peak_flops_f32", peak_flops_f32},
                      {"peak_flops_attention", peak_flops_attention},
                      {"llc_bytes", llc_bytes},
                      {"llc_bandwidth", llc_bandwidth},
                      {"measurement_spread", measurement_spread},
                      {"interconnect_bandwidth", interconnect_bandwidth},
                      {"scale_out_bandwidth", scale_out_bandwidth},
                      {"interconnect_latency_s", interconnect_latency},
                      {"scale_out_latency_s", scale_out_latency},
                      {"thread_interconnect_bandwidth", thread_interconnect_bandwidth},
                      {"thread_interconnect_latency_s", thread_interconnect_latency},
                      {"host_link_bandwidth", host_link_bandwidth},
                      {"disk_read_bandwidth", disk_read_bandwidth},
                      {"disk_write_bandwidth", disk_write_bandwidth},
                      {"price_per_hour", price_per_hour},
                      {"solo_mem_bandwidth", solo_mem_bandwidth}}) {
    if (v < 0 || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: '", k, "' must be >= 0, got ", v));
    }
  }
  if (ranks_sharing_memory < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile: 'ranks_sharing_memory' must be >= 1, got ", ranks_sharing_memory));
  }
  for (size_t i = 0; i < mem_bandwidth_by_threads.size(); ++i) {
    const BandwidthAtThreads& b = mem_bandwidth_by_threads[i];
    const int64_t previous = i > 0 ? mem_bandwidth_by_threads[i - 1].threads : 0;
    if (b.threads <= previous || !(b.bytes_per_second > 0) || !std::isfinite(b.bytes_per_second)) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: 'mem_bandwidth_by_threads' entry ", i,
                                                     " needs threads > ", previous,
                                                     " (ascending) and bytes_per_second > 0, got ", b.threads,
                                                     " and ", b.bytes_per_second));
    }
  }
  for (auto [key, sweeps] : {std::pair<const char*, const Sweeps*>{"scale_out_latency_after_sweep", &scale_out_latency_after_sweep},
                              {"interconnect_latency_after_sweep", &interconnect_latency_after_sweep}}) {
    if (absl::Status s = ValidateSweeps(key, *sweeps); !s.ok()) return s;
  }
  if (devices < 1) return absl::InvalidArgumentError(absl::StrCat("hardware profile: 'devices' must be >= 1, got ", devices));
  if (scale_up_domain < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile: 'scale_up_domain' must be >= 1, got ", scale_up_domain));
  }
  return absl::OkStatus();
}

std::string HardwareProfile::ToJson() const {
  nlohmann::json j = {{"name", name},
                      {"source", source},
                      {"peak_flops_bf16", peak_flops_bf16},
                      {"peak_flops_f32", peak_flops_f32},
                      {"peak_flops_attention", peak_flops_attention},
                      {"mem_bandwidth", mem_bandwidth},
                      {"mem_capacity", mem_capacity},
                      {"llc_bytes", llc_bytes},
                      {"llc_bandwidth", llc_bandwidth},
                      {"measurement_spread", measurement_spread},
                      {"interconnect_bandwidth", interconnect_bandwidth},
                      {"scale_out_bandwidth", scale_out_bandwidth},
                      {"interconnect_latency_s", interconnect_latency},
                      {"scale_out_latency_s", scale_out_latency},
                      {"thread_interconnect_bandwidth", thread_interconnect_bandwidth},
                      {"thread_interconnect_latency_s", thread_interconnect_latency},
                      {"host_link_bandwidth", host_link_bandwidth},
                      {"disk_read_bandwidth", disk_read_bandwidth},
                      {"disk_write_bandwidth", disk_write_bandwidth},
                      {"devices", devices},
                      {"scale_up_domain", scale_up_domain},
                      {"price_per_hour", price_per_hour},
                      {"empty_exchanges_free", empty_exchanges_free},
                      {"ranks_sharing_memory", ranks_sharing_memory},
                      {"solo_mem_bandwidth", solo_mem_bandwidth}};
  if (!mem_bandwidth_by_threads.empty()) {
    nlohmann::json a = nlohmann::json::array();
    for (const BandwidthAtThreads& b : mem_bandwidth_by_threads) {
      a.push_back({{"threads", b.threads}, {"bytes_per_second", b.bytes_per_second}});
    }
    j["mem_bandwidth_by_threads"] = a;
  }
  SweepsToJson("scale_out_latency_after_sweep", scale_out_latency_after_sweep, &j);
  SweepsToJson("interconnect_latency_after_sweep", interconnect_latency_after_sweep, &j);
  return j.dump(2);
}

absl::StatusOr<HardwareProfile> HardwareProfile::FromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("hardware profile: not a JSON object");
  HardwareProfile p;
  auto num = [&](const char* key, double* out, bool required) -> absl::Status {
    if (!j.contains(key)) {
      return required ? absl::InvalidArgumentError(absl::StrCat("hardware profile: missing '", key, "'"))
                      : absl::OkStatus();
    }
    if (!j[key].is_number()) return absl::InvalidArgumentError(absl::StrCat("hardware profile: '", key, "' must be a number"));
    *out = j[key].get<double>();
    return absl::OkStatus();
  };
  double devices = 1, domain = 1, sharing = 1;
  for (auto [key, out, required] :
       {std::tuple<const char*, double*, bool>{"peak_flops_bf16", &p.peak_flops_bf16, true},
        {"peak_flops_f32", &p.peak_flops_f32, false},
        {"peak_flops_attention", &p.peak_flops_attention, false},
        {"mem_bandwidth", &p.mem_bandwidth, true},
        {"mem_capacity", &p.mem_capacity, true},
        {"llc_bytes", &p.llc_bytes, false},
        {"llc_bandwidth", &p.llc_bandwidth, false},
        {"measurement_spread", &p.measurement_spread, false},
        {"interconnect_bandwidth", &p.interconnect_bandwidth, false},
        {"scale_out_bandwidth", &p.scale_out_bandwidth, false},
        {"interconnect_latency_s", &p.interconnect_latency, false},
        {"scale_out_latency_s", &p.scale_out_latency, false},
        {"thread_interconnect_bandwidth", &p.thread_interconnect_bandwidth, false},
        {"thread_interconnect_latency_s", &p.thread_interconnect_latency, false},
        {"host_link_bandwidth", &p.host_link_bandwidth, false},
        {"disk_read_bandwidth", &p.disk_read_bandwidth, false},
        {"disk_write_bandwidth", &p.disk_write_bandwidth, false},
        {"devices", &devices, false},
        {"scale_up_domain", &domain, false},
        {"price_per_hour", &p.price_per_hour, false},
        {"ranks_sharing_memory", &sharing, false},
        {"solo_mem_bandwidth", &p.solo_mem_bandwidth, false}}) {
    if (absl::Status s = num(key, out, required); !s.ok()) return s;
  }
  p.devices = static_cast<int64_t>(devices);
  p.scale_up_domain = static_cast<int64_t>(domain);
  p.ranks_sharing_memory = static_cast<int64_t>(sharing);
  if (j.contains("mem_bandwidth_by_threads")) {
    const nlohmann::json& a = j["mem_bandwidth_by_threads"];
    const char* shape = "hardware profile: 'mem_bandwidth_by_threads' must be an array of {\"threads\": number, "
                        "\"bytes_per_second\": number}";
    if (!a.is_array()) return absl::InvalidArgumentError(shape);
    for (const nlohmann::json& e : a) {
      if (!e.is_object() || !e.contains("threads") || !e.contains("bytes_per_second") || !e["threads"].is_number() ||
          !e["bytes_per_second"].is_number()) {
        return absl::InvalidArgumentError(shape);
      }
      p.mem_bandwidth_by_threads.push_back({static_cast<int64_t>(e["threads"].get<double>()), e["bytes_per_second"].get<double>()});
    }
  }
  if (j.contains("empty_exchanges_free")) {
    if (!j["empty_exchanges_free"].is_boolean()) {
      return absl::InvalidArgumentError("hardware profile: 'empty_exchanges_free' must be true or false");
    }
    p.empty_exchanges_free = j["empty_exchanges_free"].get<bool>();
  }
  if (absl::Status s = ParseSweeps(j, "scale_out_latency_after_sweep", &p.scale_out_latency_after_sweep); !s.ok()) return s;
  if (absl::Status s = ParseSweeps(j, "interconnect_latency_after_sweep", &p.interconnect_latency_after_sweep); !s.ok()) {
    return s;
  }
  if (j.contains("name") && j["name"].is_string()) p.name = j["name"];
  if (j.contains("source") && j["source"].is_string()) p.source = j["source"];
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  return p;
}

std::vector<std::string> HardwarePresetNames() { return {"h100-sxm", "h200", "b200", "gb200-nvl72"}; }

absl::StatusOr<HardwareProfile> HardwarePreset(const std::string& name) {
  constexpr double T = 1e12, G = 1e9;
  HardwareProfile p;
  p.name = name;
  p.host_link_bandwidth = 64 * G;  // PCIe Gen5 x16, per direction
  // Per collective call: small-message all-to-all latency of NCCL inside an NVLink domain and
  // across an InfiniBand/RoCE fabric, as nccl-tests report them (tens of microseconds; not a
  // datasheet figure; docs/roofline.md).
  p.interconnect_latency = 10e-6;
  p.scale_out_latency = 25e-6;
  p.disk_read_bandwidth = 7 * G;   // a PCIe Gen4 NVMe SSD
  p.disk_write_bandwidth = 5 * G;
  if (name == "h100-sxm") {
    p.source = "datasheet: NVIDIA H100 Tensor Core GPU (SXM5)";
    p.peak_flops_bf16 = 989.4 * T;
    p.mem_bandwidth = 3.35 * T;
    p.mem_capacity = 80 * G;
    p.interconnect_bandwidth = 450 * G;  // NVLink 4: 900 GB/s bidirectional
    p.scale_out_bandwidth = 50 * G;      // one 400 Gb/s ConnectX-7 NIC per GPU
    p.scale_up_domain = 8;
    p.price_per_hour = 2.5;
  } else if (name == "h200") {
    p.source = "datasheet: NVIDIA H200 Tensor Core GPU (SXM)";
    p.peak_flops_bf16 = 989.4 * T;
    p.mem_bandwidth = 4.8 * T;
    p.mem_capacity = 141 * G;
    p.interconnect_bandwidth = 450 * G;
    p.scale_out_bandwidth = 50 * G;  // 400 Gb/s per GPU
    p.scale_up_domain = 8;
    p.price_per_hour = 3.5;
  } else if (name == "b200") {
    p.source = "datasheet: NVIDIA HGX B200 (per GPU: 18 PFLOPS dense FP16/BF16 per 8 GPUs)";
    p.peak_flops_bf16 = 2.25e15;
    p.mem_bandwidth = 8 * T;
    p.mem_capacity = 180 * G;
    p.interconnect_bandwidth = 900 * G;  // NVLink 5: 1.8 TB/s bidirectional
    p.scale_out_bandwidth = 50 * G;      // 400 Gb/s per GPU
    p.scale_up_domain = 8;
    p.price_per_hour = 5.0;
  } else if (name == "gb200-nvl72") {
    p.source = "datasheet: NVIDIA GB200 NVL72 (180 PFLOPS dense FP16/BF16, 576 TB/s, 13.4 TB HBM3e per 72 GPUs)";
    p.peak_flops_bf16 = 2.5e15;
    p.mem_bandwidth = 8 * T;
    p.mem_capacity = 186 * G;
    p.interconnect_bandwidth = 900 * G;
    p.scale_out_bandwidth = 100 * G;  // one 800 Gb/s ConnectX-8 SuperNIC per GPU
    p.devices = 72;
    p.scale_up_domain = 72;
    p.price_per_hour = 6.0;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--hardware: unknown preset '", name, "' (",
                                                   absl::StrJoin(HardwarePresetNames(), ", "),
                                                   ", or the path of a JSON profile from `moeserve calibrate`)"));
  }
  return p;
}

absl::StatusOr<HardwareProfile> LoadHardware(const std::string& preset_or_path) {
  for (const std::string& n : HardwarePresetNames()) {
    if (n == preset_or_path) return HardwarePreset(n);
  }
  auto text = ReadFileToString(preset_or_path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--hardware: '", preset_or_path, "' is neither a preset (",
                                                   absl::StrJoin(HardwarePresetNames(), ", "),
                                                   ") nor a readable file: ", text.status().message()));
  }
  auto p = HardwareProfile::FromJson(*text);
  if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat(preset_or_path, ": ", p.status().message()));
  return p;
}

}  // namespace moeserve::roofline
