// `moeserve calibrate`: measures the machine at hand and writes a hardware profile (JSON) that
// `serve`, `bench` and `roofline` load with --hardware.
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "tools/calibrate/measure.h"
#include "tools/calibrate/mpi_transports.h"
#include "tools/commands.h"
#include "tools/mpi_job.h"

namespace moeserve::tools {
namespace {

struct CalibrateOptions {
  std::string out;
  int threads = 0;
  double array_mb = 256;
  std::string disk_dir = "/tmp";
  double disk_mb = 512;
  bool no_disk = false;
  double price_per_hour = 0;
  bool quick = false;
  bool no_progress = false;
  bool no_mpi = false;
  std::string scale_out_mpirun_args;
  CpuKernelFlags cpu_kernel;
};

// Under mpirun: only the all-to-all of the job's ranks, printed by rank 0 (the transports
// measurement of a plain `calibrate` runs this).
int RunAllToAllProbe(const CalibrateOptions& o) {
  auto probe = moeserve::calibrate::ProbeAllToAllUnderMpi(o.quick);
  if (!probe.ok()) return Fail(probe.status());
  if (!probe->empty()) std::printf("%s\n", probe->dump().c_str());
  return 0;
}

int RunCalibrate(const CalibrateOptions& o) {
  if (LaunchedByMpirun()) return RunAllToAllProbe(o);
  if (!(o.array_mb > 0) || !(o.disk_mb > 0)) return Fail(absl::InvalidArgumentError("--array-mb and --disk-mb must be > 0"));
  if (o.price_per_hour < 0) return Fail(absl::InvalidArgumentError("--price-per-hour must be >= 0"));
  calibrate::CalibrateSettings cs;
  cs.threads = o.threads;
  cs.array_mb = o.array_mb;
  cs.disk_dir = o.disk_dir;
  cs.disk_mb = o.disk_mb;
  cs.disk = !o.no_disk;
  cs.quick = o.quick;
  cs.progress = !o.no_progress;
  cs.price_per_hour = o.price_per_hour;
  CpuBackendOptions bo;
  bo.num_threads = o.threads;
  if (absl::Status s = ApplyCpuKernelFlags(o.cpu_kernel, &bo); !s.ok()) return Fail(s);
  CpuBackend backend(bo);
  auto result = calibrate::Calibrate(&backend, cs);
  if (!result.ok()) return Fail(result.status());
  // Between threads of one process: what a layout of thread ranks pays per all-to-all.
  if (cs.progress) std::fprintf(stderr, "calibrate: all-to-all between 2 threads ...\n");
  if (auto threads = moeserve::calibrate::MeasureThreadTransport(o.quick); threads.ok()) {
    result->json["thread_interconnect_bandwidth"] = moeserve::calibrate::BestBandwidth(*threads);
    result->json["thread_interconnect_latency_s"] = moeserve::calibrate::CallLatency(*threads);
    result->json["thread_alltoall"] = *threads;
  } else {
    std::fprintf(stderr, "calibrate: no thread all-to-all measured: %s\n", std::string(threads.status().message()).c_str());
  }
  if (!o.no_mpi) {
    // Between processes: shared memory stands for the scale-up links, TCP for the scale-out
    // network; their all-to-all bandwidths price the EP traffic inside and across domains.
    if (cs.progress) std::fprintf(stderr, "calibrate: all-to-all between 2 processes over shared memory and TCP ...\n");
    auto mpi = moeserve::calibrate::MeasureMpiTransports(o.quick, o.scale_out_mpirun_args);
    if (mpi.ok()) {
      result->json["interconnect_bandwidth"] = moeserve::calibrate::BestBandwidth((*mpi)["shared_memory"]);
      result->json["scale_out_bandwidth"] = moeserve::calibrate::BestBandwidth((*mpi)["tcp"]);
      result->json["interconnect_latency_s"] = moeserve::calibrate::CallLatency((*mpi)["shared_memory"]);
      result->json["scale_out_latency_s"] = moeserve::calibrate::CallLatency((*mpi)["tcp"]);
      // The exchanges of a step follow a layer's streaming: what that costs the next call.
      if (auto after = moeserve::calibrate::AfterSweepLatencies((*mpi)["tcp"]); !after.empty()) {
        result->json["scale_out_latency_after_sweep"] = after;
      }
      if (auto after = moeserve::calibrate::AfterSweepLatencies((*mpi)["shared_memory"]); !after.empty()) {
        result->json["interconnect_latency_after_sweep"] = after;
      }
      // A property of the MPI library's all-to-all, read where the latency makes it plain (over
      // shared memory an empty call and a 64-byte one differ by a fraction of a microsecond).
      result->json["empty_exchanges_free"] = moeserve::calibrate::EmptyExchangeFree((*mpi)["tcp"]);
      result->json["mpi_alltoall"] = *mpi;
      if (!o.scale_out_mpirun_args.empty()) result->json["scale_out_mpirun_args"] = o.scale_out_mpirun_args;
    } else if (!o.scale_out_mpirun_args.empty()) {
      return Fail(mpi.status());  // the link asked for was not measured: no profile without it
    } else {
      std::fprintf(stderr, "calibrate: no MPI transports measured: %s\n", std::string(mpi.status().message()).c_str());
    }
  }
  const std::string text = result->json.dump(2) + "\n";
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    if (absl::Status s = WriteFileAtomically(o.out, text); !s.ok()) return Fail(s);
    std::fprintf(stderr, "calibrate: wrote %s (use it with --hardware %s)\n", o.out.c_str(), o.out.c_str());
  }
  return 0;
}

}  // namespace

void AddCalibrateCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Measure this machine (memory bandwidth, GEMM FLOP/s, copy and disk bandwidth) into a profile");
  cmd->add_option("--out", o->out, "Write the JSON profile here (default: stdout)");
  cmd->add_option("--threads", o->threads, "Threads (0: one per CPU this process may run on, as the engine uses)")
      ->capture_default_str();
  AddCpuKernelFlags(cmd, &o->cpu_kernel);
  cmd->add_option("--array-mb", o->array_mb, "Size of each STREAM array in MiB (far above the caches)")
      ->capture_default_str();
  cmd->add_option("--disk-dir", o->disk_dir, "Directory on the disk to measure")->capture_default_str();
  cmd->add_option("--disk-mb", o->disk_mb, "MiB written and read back on the disk")->capture_default_str();
  cmd->add_flag("--no-disk", o->no_disk, "Skip the disk measurement (the profile's disk bandwidths are 0)");
  cmd->add_option("--price-per-hour", o->price_per_hour, "$ per hour of this machine, stored in the profile")
      ->capture_default_str();
  cmd->add_flag("--quick", o->quick, "Small sizes and few repeats (seconds; for tests, less accurate)");
  cmd->add_flag("--no-progress", o->no_progress, "Do not draw the progress line");
  cmd->add_flag("--no-mpi", o->no_mpi,
                "Skip the all-to-all between processes over Open MPI's shared memory and TCP (which set "
                "interconnect_bandwidth, scale_out_bandwidth and their per-call latencies). Under mpirun, calibrate "
                "measures only that "
                "all-to-all, over the transport mpirun chose, and rank 0 prints it as JSON");
  cmd->add_option("--scale-out-mpirun-args", o->scale_out_mpirun_args,
                  "mpirun arguments for the scale-out probe in place of \"--mca btl self,tcp\": a hostfile and launch "
                  "agent that put its 2 ranks on 2 hosts or network namespaces (docs/multi-host.md), so that "
                  "scale_out_bandwidth and scale_out_latency_s are that link's, not loopback's; passed through a shell");
  cmd->callback([o, exit_code] {
    if (o->no_mpi && !o->scale_out_mpirun_args.empty()) {
      *exit_code = Fail(absl::InvalidArgumentError("--scale-out-mpirun-args measures over MPI: drop --no-mpi"));
      return;
    }
    *exit_code = RunCalibrate(*o);
  });
}

}  // namespace moeserve::tools
