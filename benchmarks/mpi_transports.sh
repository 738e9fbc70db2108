#!/usr/bin/env bash
# Measures the all-to-all of expert parallelism between processes over Open MPI's two
# transports on this machine: shared memory (`--mca btl self,vader`, standing in for a scale-up
# domain such as NVLink) and TCP over loopback (`--mca btl self,tcp`, standing in for the
# scale-out network), with 2 and 4 ranks, ROUNDS rounds alternating the two back to back.
# Prints every round's CSV and writes them to ${OUT:-/tmp/moeserve-mpi-transports}/rounds.csv.
#
#   benchmarks/mpi_transports.sh [ROUNDS] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}" ITERS="${2:-50}"
OUT="${OUT:-/tmp/moeserve-mpi-transports}"
mkdir -p "$OUT"
[[ -x build/benchmarks/mpi_alltoall_bench ]] || scripts/build.sh >&2
echo "round,transport,ranks,bytes_per_peer,median_us,p90_us,bus_gbps" > "$OUT/rounds.csv"
for round in $(seq "$ROUNDS"); do
  for np in 2 4; do
    for transport in vader tcp; do
      mpirun --oversubscribe --allow-run-as-root --mca btl "self,$transport" -np "$np" \
        build/benchmarks/mpi_alltoall_bench "$ITERS" | tail -n +2 | sed "s/^/$round,$transport,/" \
        | tee -a "$OUT/rounds.csv"
    done
  done
done
echo "wrote $OUT/rounds.csv" >&2
