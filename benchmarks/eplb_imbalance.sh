#!/usr/bin/env bash
# Re-placing experts while serving (--eplb-interval) against the fixed placements: the same
# prefill workload at --ep N, contiguous, contiguous with EPLB re-placing every INTERVAL steps
# from the last WINDOW steps, and balanced from a load recorded on other prompts. Writes each
# run's step trace, its log (the EPLB lines) and imbalance.csv: every step's busiest EP rank's
# expert rows over the mean rank's (rank_imbalance) and its tokens/s, per setting.
#   MODEL=/tmp/models/small EP=4 benchmarks/eplb_imbalance.sh OUT
# REPLICAS=R adds --expert-replicas R to the EPLB and balanced runs (EPLB learns the copies too).
# EP ranks are threads: on a machine with fewer cores than ranks the tokens/s are the host's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${MODEL:?set MODEL to a checkpoint directory (moeserve make-model --preset small ...)}"
MS=${MS:-$here/../build/tools/moeserve}
EP=${EP:-4} REPLICAS=${REPLICAS:-0} INTERVAL=${INTERVAL:-4} WINDOW=${WINDOW:-4} REQUESTS=${REQUESTS:-128} LEN=${LEN:-512} STEP=${STEP:-4096}
out=${1:-eplb-imbalance}
mkdir -p "$out"
common=(--model "$MODEL" --ep "$EP" --num-requests "$REQUESTS" --prompt-len "$LEN" --output-len 1
        --max-tokens-per-step "$STEP")
echo "recording a load on other prompts (--seed 1)" >&2
"$MS" bench --model "$MODEL" --num-requests "$REQUESTS" --prompt-len "$LEN" --output-len 1 --max-tokens-per-step "$STEP" \
  --seed 1 --expert-load-out "$out/load-seed1.json" --out "$out/record.json" >"$out/record.log" 2>&1
run() {  # $1 setting name, then its flags
  local name=$1
  shift
  echo "$name" >&2
  "$MS" bench "${common[@]}" --seed 2 --trace-jsonl "$out/$name.jsonl" --out "$out/$name.json" "$@" >"$out/$name.log" 2>&1
}
run contiguous
run eplb --eplb-interval "$INTERVAL" --eplb-window "$WINDOW" --expert-replicas "$REPLICAS"
run balanced-recorded --expert-placement balanced --expert-load "$out/load-seed1.json" --expert-replicas "$REPLICAS"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
names = ["contiguous", "eplb", "balanced-recorded"]
steps = {n: [json.loads(l) for l in open(f"{out}/{n}.jsonl")] for n in names}
with open(f"{out}/imbalance.csv", "w") as f:
    f.write("step," + ",".join(f"{n}_rank_imbalance,{n}_tok_s" for n in names) + "\n")
    for i in range(min(len(s) for s in steps.values())):
        f.write(f"{i}," + ",".join(f"{steps[n][i]['rank_imbalance']:.4f},{steps[n][i]['num_tokens'] / steps[n][i]['duration_s']:.1f}"
                                   for n in names) + "\n")
for n in names:
    r = [s["rank_imbalance"] for s in steps[n]]
    print(f"{n}: rank imbalance steps 0-3 {min(r[:4]):.3f}-{max(r[:4]):.3f}, steps 4+ {min(r[4:]):.3f}-{max(r[4:]):.3f}")
PY
grep -h "EPLB at step" "$out/eplb.log" || true
