#!/usr/bin/env bash
# Two moeserve binaries against each other, interleaved, for a change that should change no bit
# but the time: decode sweeps (each point's step, attention and MoE times) and, optionally, a
# 2000-token prefill. Rounds alternate the order (A B, then B A) so a host that drifts between
# minutes moves both alike; the summary gives medians per binary and A's time over B's (above 1:
# B is faster), and for each sweep point the attention share over the MoE share, which a change
# to one phase moves while the host moves both. Build the two binaries first (copy the old one
# aside before rebuilding).
#
#   benchmarks/ab_binaries.sh A_BIN B_BIN [OUT_DIR]
#   env: ROUNDS (4), PRESET (small), BATCHES (8,64), CONTEXTS (192,1024), STEPS (30),
#        PREFILL (1: also 8 prompts of 2000 tokens in one step each; 0: skip),
#        THREADS (0: every CPU this process may run on), HARDWARE (a calibrate profile, so that no
#        run calibrates; default the committed Sapphire Rapids VM profile: it sets only the
#        predictions, which this comparison does not use)
# About 1 minute per round on 2 cores with the defaults.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
a=$(realpath -m "$1")
b=$(realpath -m "$2")
out=$(realpath -m "${3:-ab-binaries}")
rounds=${ROUNDS:-4}
preset=${PRESET:-small}
batches=${BATCHES:-8,64}
contexts=${CONTEXTS:-192,1024}
steps=${STEPS:-30}
prefill=${PREFILL:-1}
threads=${THREADS:-0}
hardware=$(realpath -m "${HARDWARE:-$repo/docs/data/spr-vm-calibrate-2026-11-27.json}")
for bin in "$a" "$b"; do
  [[ -x "$bin" ]] || { echo "ab_binaries.sh: not an executable: $bin" >&2; exit 2; }
done
[[ -f "$hardware" ]] || { echo "ab_binaries.sh: HARDWARE: no such profile: $hardware" >&2; exit 2; }
for n in "$rounds" "$steps"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "ab_binaries.sh: ROUNDS and STEPS must be positive integers, got '$n'" >&2; exit 2; }
done
[[ "$prefill" == 0 || "$prefill" == 1 ]] || { echo "ab_binaries.sh: PREFILL must be 0 or 1, got '$prefill'" >&2; exit 2; }
mkdir -p "$out"

run() {  # run LOG COMMAND...: fails the script with the log's tail
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    echo "ab_binaries.sh: failed: $*" >&2
    tail -5 "$log" >&2
    exit 1
  fi
}

measure() {  # measure NAME BIN ROUND
  local name=$1 bin=$2 r=$3
  run "$out/sweep-$name-r$r.log" "$bin" bench --preset "$preset" --dtype bf16 --threads "$threads" \
    --sweep-batch "$batches" --context "$contexts" --sweep-steps "$steps" --hardware "$hardware" \
    --out "$out/sweep-$name-r$r.json"
  if [[ "$prefill" == 1 ]]; then
    run "$out/prefill-$name-r$r.log" "$bin" bench --preset "$preset" --dtype bf16 --threads "$threads" \
      --num-requests 8 --prompt-len 2000 --output-len 1 --kv-dtype bf16 --max-tokens-per-step 2000 \
      --out "$out/prefill-$name-r$r.json"
  fi
}

for r in $(seq 1 "$rounds"); do
  if (( r % 2 == 1 )); then order=(A B); else order=(B A); fi
  for name in "${order[@]}"; do
    if [[ "$name" == A ]]; then measure A "$a" "$r"; else measure B "$b" "$r"; fi
  done
  echo "ab_binaries.sh: round $r of $rounds done" >&2
done

python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import csv, json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []  # (metric, A values, B values)
def sweep(name, r):
    return json.load(open(os.path.join(out, f"sweep-{name}-r{r}.json")))["points"]
points = [(p["batch"], p["context"]) for p in sweep("A", 1)]
for i, (batch, ctx) in enumerate(points):
    for key, label in (("observed_s", "step"), ("attention_s", "attention"), ("moe_s", "moe")):
        va = [sweep("A", r)[i][key] * 1e3 for r in range(1, rounds + 1)]
        vb = [sweep("B", r)[i][key] * 1e3 for r in range(1, rounds + 1)]
        rows.append((f"batch {batch} context {ctx} {label} ms", va, vb))
    share = lambda name: [sweep(name, r)[i]["attention_s"] / max(sweep(name, r)[i]["moe_s"], 1e-12)
                          for r in range(1, rounds + 1)]
    rows.append((f"batch {batch} context {ctx} attention / moe", share("A"), share("B")))
prefill = os.path.join(out, "prefill-A-r1.json")
if os.path.exists(prefill):
    step = lambda name, r: json.load(open(os.path.join(out, f"prefill-{name}-r{r}.json")))["parallel"]["mean_step_ms"]
    rows.append(("prefill 2000 tokens step ms", [step("A", r) for r in range(1, rounds + 1)],
                 [step("B", r) for r in range(1, rounds + 1)]))
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["metric", "a_median", "b_median", "a_over_b", "a_values", "b_values"])
    print(f"{'metric':44} {'A median':>9} {'B median':>9} {'A / B':>6}  (A values | B values)")
    for metric, va, vb in rows:
        ma, mb = statistics.median(va), statistics.median(vb)
        ratio = ma / mb if mb else float("nan")
        w.writerow([metric, f"{ma:.4f}", f"{mb:.4f}", f"{ratio:.3f}", " ".join(f"{v:.4f}" for v in va),
                    " ".join(f"{v:.4f}" for v in vb)])
        print(f"{metric:44} {ma:9.3f} {mb:9.3f} {ratio:6.3f}  ({' '.join(f'{v:.2f}' for v in va)} | "
              f"{' '.join(f'{v:.2f}' for v in vb)})")
PY
echo "ab_binaries.sh: wrote $out/summary.txt and $out/summary.csv" >&2
