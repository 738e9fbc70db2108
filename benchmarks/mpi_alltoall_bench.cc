// The all-to-all of expert parallelism over real processes: each rank sends `bytes` to every
// peer through MpiCommunicator::AllToAll, as a MoE layer's dispatch does, and the median time
// over `iters` calls (after warm-up) is printed as CSV by rank 0:
//   ranks,bytes_per_peer,median_us,p90_us,bus_gbps
// where bus_gbps counts the bytes each rank sends to the others per second. Run it under
// mpirun with the transport to measure (benchmarks/mpi_transports.sh: shared memory, the
// scale-up stand-in, against TCP, the scale-out one).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "parallel/alltoall_probe.h"
#include "parallel/mpi_communicator.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  auto comm = moeserve::MpiCommunicator::Create(MPI_COMM_WORLD);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", std::string(comm.status().message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int n = (*comm)->size(), me = (*comm)->rank();
  if (me == 0) std::printf("ranks,bytes_per_peer,median_us,p90_us,bus_gbps\n");
  // Nothing (an exchange in which no rank sends a row: what a dispatch costs when every token's
  // experts are on its own rank), a message that is all latency, one decode token's hidden
  // state (4 KiB of fp32 at hidden 1024), up to a prefill chunk's.
  for (int64_t bytes : {0LL, 64LL, 4096LL, 65536LL, 1LL << 20, 8LL << 20}) {
    auto t = moeserve::TimeAllToAll(comm->get(), bytes, iters);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (me == 0) {
      std::printf("%d,%lld,%.1f,%.1f,%.3f\n", n, static_cast<long long>(bytes), t->median_us, t->p90_us,
                  t->bus_bytes_per_second / 1e9);
    }
  }
  comm->reset();
  MPI_Finalize();
  return 0;
}
