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
  double peak_flops_attention = 0;  // FLOP/s of the instructions attention issues (0: same as the GEMM's)
  double mem_bandwidth = 0;    // bytes/s of the memory weights and KV live in (HBM, or DRAM on a CPU)
  double mem_capacity = 0;     // bytes
  // Calibrated CPU profiles: the memory bandwidth at each thread count calibrate measured,
  // ascending, the last its own (mem_bandwidth); one thread pulls well over its share of two.
  // Empty: not measured.
  struct BandwidthAtThreads {
    int64_t threads = 0;
    double bytes_per_second = 0;
  };
  std::vector<BandwidthAtThreads> mem_bandwidth_by_threads;
  // A rank's profile (explore's RankShare): mem_bandwidth is its share of what
  // `ranks_sharing_memory` ranks of one machine pull together; with fewer of them streaming (a
  // pipeline's fill and drain), it streams at up to `solo_mem_bandwidth`, what its own threads
  // pull alone. 1 and 0: no sharing modelled.
  int64_t ranks_sharing_memory = 1;
  double solo_mem_bandwidth = 0;
  // The last-level cache (CPUs): a step whose working set fits in it streams at its bandwidth,
  // not at the memory's. 0: not modelled (GPU presets: HBM is the roofline).
  double llc_bytes = 0;
  double llc_bandwidth = 0;
  // Calibrated profiles: the widest (max - min) / median spread of the samples behind the peaks
  // and bandwidths above; a fraction of bound is only as good as this. 0: not measured.
  double measurement_spread = 0;
  double interconnect_bandwidth = 0;  // scale-up link, bytes/s per direction per device (NVLink)
  double scale_out_bandwidth = 0;     // network between scale-up domains, bytes/s per direction per
                                      // device (InfiniBand / Ethernet NIC); 0: none modelled
  // Latency of one collective call (an all-to-all, or a stage hand-off) on each link kind,
  // seconds: what a decode-sized message costs whatever its bytes. 0: not modelled.
  double interconnect_latency = 0;
  double scale_out_latency = 0;
  // On a CPU: the all-to-all between ranks that are threads of one process (a rendezvous in
  // memory), by the same measure; what a layout of thread ranks pays. 0: not measured.
  double thread_interconnect_bandwidth = 0;
  double thread_interconnect_latency = 0;
  // Whether an all-to-all in which no rank sends anything completes without a round trip, as
  // with Open MPI (calibrate measures it: 0.6 µs against 547 µs for 64 bytes over a 500 µs link).
  // Then the dispatch's row exchanges pay the latency only when some row changes rank. False
  // where not measured (presets) and for thread ranks, which always meet.
  bool empty_exchanges_free = false;
  // The scale-out call latency measured right after each of several reads of `sweep_bytes`
  // (calibrate's after-sweep probe; ascending sweep_bytes): an exchange that follows a layer's
  // streaming finds MPI's state and the socket buffers out of the caches. Empty: not measured,
  // scale_out_latency alone.
  struct LatencyAfterSweep {
    double sweep_bytes = 0, latency = 0;
  };
  std::vector<LatencyAfterSweep> scale_out_latency_after_sweep;
  // The same for the scale-up link (between processes of one host, over MPI's shared memory;
  // thread ranks, which meet in memory, keep the idle latency).
  std::vector<LatencyAfterSweep> interconnect_latency_after_sweep;
  double host_link_bandwidth = 0;     // device <-> host DDR, bytes/s per direction (PCIe)
  double disk_read_bandwidth = 0;     // flash, bytes/s
  double disk_write_bandwidth = 0;
  // Topology.
  int64_t devices = 1;           // devices the model is spread over by default
  int64_t scale_up_domain = 1;   // devices in one switched fast domain
  double price_per_hour = 0;     // $ per device-hour, for cost per token

  // FLOP/s for weights of this dtype ("bf16" or "f32").
  double PeakFlops(const std::string& weight_dtype) const;
  double AttentionPeakFlops(const std::string& weight_dtype) const {
    return peak_flops_attention > 0 ? peak_flops_attention : PeakFlops(weight_dtype);
  }
  // Bytes/s a step reads at when its working set is `bytes`: the LLC's when it fits there.
  double BandwidthFor(double working_set_bytes) const {
    return llc_bytes > 0 && llc_bandwidth > 0 && working_set_bytes <= llc_bytes ? llc_bandwidth : mem_bandwidth;
  }
  // The scale-out call latency after streaming `bytes`: scale_out_latency at 0, linear in the
  // bytes up to the first sweep measured, log-linear between sweeps, the last beyond it.
  double ScaleOutLatencyAfter(double bytes) const;
  double InterconnectLatencyAfter(double bytes) const;
  // A rank's memory bandwidth while `active` ranks of its machine stream (see
  // solo_mem_bandwidth): their total split evenly, at most what it pulls alone, at least its share.
  double MemBandwidthWithActive(int64_t active) const;
  // The machine's bandwidth at `threads` threads, from mem_bandwidth_by_threads (the largest
  // entry at or below them); 0 where none is.
  double MemBandwidthAtThreads(int64_t threads) const;
  // Dense bf16 FLOP/s over memory bandwidth: the machine's arithmetic intensity.
  double FlopsPerByte() const { return peak_flops_bf16 / mem_bandwidth; }
  absl::Status Validate() const;
  std::string ToJson() const;
  static absl::StatusOr<HardwareProfile> FromJson(const std::string& text);
};

// The exchanges of ranks that are threads of one process: they meet at every all-to-all, empty
// or not, and through memory rather than MPI's shared memory, whose after-sweep latencies do
// not apply to them.
void UseThreadRankExchanges(HardwareProfile* hw);

std::vector<std::string> HardwarePresetNames();
absl::StatusOr<HardwareProfile> HardwarePreset(const std::string& name);
// A preset name, or the path of a JSON profile (from `moeserve calibrate`).
absl::StatusOr<HardwareProfile> LoadHardware(const std::string& preset_or_path);

}  // namespace moeserve::roofline
