// Hardware profiles: the peaks a roofline is drawn from. Presets carry datasheet figures (sources
// in docs/roofline.md); `moeserve calibrate` writes a measured profile of the machine at hand in
// the same JSON form, which `serve`, `bench` and `roofline` load with --hardware.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve::roofline {

struct HardwareProfile {
  std::string name;
  std::string source;  // "datasheet: ..." or "calibrated on HOST at DATE"
  // Per device.
  double peak_flops_bf16 = 0;  // dense FLOP/s of the GEMM with bf16 weights
  double peak_flops_f32 = 0;   // dense FLOP/s of the GEMM with f32 weights (0: same as bf16)
  double mem_bandwidth = 0;    // bytes/s of the memory weights and KV live in (HBM, or DRAM on a CPU)
  double mem_capacity = 0;     // bytes
  double interconnect_bandwidth = 0;  // scale-up link, bytes/s per direction per device (NVLink)
  double scale_out_bandwidth = 0;     // network between scale-up domains, bytes/s per direction per
                                      // device (InfiniBand / Ethernet NIC); 0: none modelled
  double host_link_bandwidth = 0;     // device <-> host DDR, bytes/s per direction (PCIe)
  double disk_read_bandwidth = 0;     // flash, bytes/s
  double disk_write_bandwidth = 0;
  // Topology.
  int64_t devices = 1;           // devices the model is spread over by default
  int64_t scale_up_domain = 1;   // devices in one switched fast domain
  double price_per_hour = 0;     // $ per device-hour, for cost per token

  // FLOP/s for weights of this dtype ("bf16" or "f32").
  double PeakFlops(const std::string& weight_dtype) const;
  // Dense bf16 FLOP/s over memory bandwidth: the machine's arithmetic intensity.
  double FlopsPerByte() const { return peak_flops_bf16 / mem_bandwidth; }
  absl::Status Validate() const;
  std::string ToJson() const;
  static absl::StatusOr<HardwareProfile> FromJson(const std::string& text);
};

std::vector<std::string> HardwarePresetNames();
absl::StatusOr<HardwareProfile> HardwarePreset(const std::string& name);
// A preset name, or the path of a JSON profile (from `moeserve calibrate`).
absl::StatusOr<HardwareProfile> LoadHardware(const std::string& preset_or_path);

}  // namespace moeserve::roofline
