#!/usr/bin/env bash
# Prefill of one long prompt, vLLM's CPU build against moeserve on the same weights (issue 26,
# item 5), interleaved rounds. Never in CI: vLLM comes from shared/peer/vllm/install.sh.
#
#   VENV=... MODEL=DIR [MS=build/tools/moeserve] [LEN=2000] [ROUNDS=3] benchmarks/prefill_vs_vllm.sh [OUT_DIR]
#
# vLLM loads the model once per round, prefills one untimed prompt (warm-up: JIT kernels,
# first-touch memory), then REPS distinct prompts of LEN random ids (no prefix-cache hits), one
# output token each; moeserve runs `bench` once per prompt. A prompt's time is its time to first
# token. moeserve runs with its default f32 KV cache, with a bf16 one (vLLM's, for the model's
# dtype; the bf16 kernel variants then attend on vdpbf16ps or AMX tiles), with bf16 and the whole
# prompt in one step (as vLLM's budget takes it), and that in one process after a warm-up prompt
# (as vLLM's runs; the time is the prompt's engine step).
# Prints one CSV row per prompt: engine,setting,round,seconds,prefill_tok_s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${VENV:?set VENV to the virtualenv of shared/peer/vllm/install.sh}" "${MODEL:?set MODEL to a make-model directory}"
MS=${MS:-$here/../build/tools/moeserve}
LEN=${LEN:-2000} ROUNDS=${ROUNDS:-3} REPS=${REPS:-3}
out=${1:-prefill-vs-vllm}
mkdir -p "$out"
source "$here/../../shared/peer/vllm/env.sh" 2>/dev/null || source /work/shared/peer/vllm/env.sh

run_vllm() {  # $1 round; vLLM's log to a file, its CSV rows to stdout
  "$VENV/bin/python" "$here/vllm_prefill.py" "$MODEL" "$LEN" "$REPS" "$1" >"$out/vllm_r$1.log" 2>&1 ||
    { echo "vLLM failed: $out/vllm_r$1.log" >&2; exit 1; }
  grep '^vllm,' "$out/vllm_r$1.log"
}

run_moeserve() {  # $1 round, $2 setting name, then extra flags
  local r=$1 name=$2 i
  shift 2
  # A process per prompt (bench has no warm-up request): each time includes the first touch of
  # the KV arena and the activations, which only counts against moeserve.
  for i in $(seq 1 "$REPS"); do
    LD_PRELOAD= "$MS" bench --model "$MODEL" --num-requests 1 --prompt-len "$LEN" --output-len 1 \
      --seed $((7000 + 10 * r + i)) --out "$out/ms_${name}_r${r}_$i.json" "$@" >"$out/ms_${name}_r${r}_$i.log" 2>&1
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["ttft_ms"]["p50"] / 1e3
print(f"moeserve,{sys.argv[2]},{sys.argv[3]},{t:.4f},{int(sys.argv[4]) / t:.1f}")' \
      "$out/ms_${name}_r${r}_$i.json" "$name" "$r" "$LEN"
  done
}

# One process, a warm-up prompt then REPS more (as vLLM's runs): each prompt's prefill step from
# the step trace (one prompt per step: the step's token budget is LEN).
run_moeserve_warm() {  # $1 round
  local r=$1 name=kv-bf16-one-step-warm
  LD_PRELOAD= "$MS" bench --model "$MODEL" --num-requests $((REPS + 1)) --prompt-len "$LEN" --output-len 1 \
    --seed $((7000 + 10 * r)) --kv-dtype bf16 --max-tokens-per-step "$LEN" --trace-jsonl "$out/ms_${name}_r${r}.jsonl" \
    --out "$out/ms_${name}_r${r}.json" >"$out/ms_${name}_r${r}.log" 2>&1
  python3 -c 'import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
for s in steps[1:]:
    assert s["num_tokens"] == int(sys.argv[3]), "a step that is not one whole prompt"
    t = s["duration_s"]
    print(f"moeserve,kv-bf16-one-step-warm,{sys.argv[2]},{t:.4f},{int(sys.argv[3]) / t:.1f}")' \
    "$out/ms_${name}_r${r}.jsonl" "$r" "$LEN"
}

echo "engine,setting,round,seconds,prefill_tok_s"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then run_vllm "$r"; fi
  run_moeserve "$r" default
  run_moeserve "$r" kv-bf16 --kv-dtype bf16
  run_moeserve "$r" kv-bf16-one-step --kv-dtype bf16 --max-tokens-per-step "$LEN"
  run_moeserve_warm "$r"
  if [ $((r % 2)) -eq 0 ]; then run_vllm "$r"; fi
done
