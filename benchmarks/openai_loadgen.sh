#!/usr/bin/env bash
# Drives moeserve's OpenAI-compatible HTTP API with a well-known third-party load generator,
# GuideLLM (vLLM project's, from PyPI, pinned), and runs `moeserve loadgen` (gRPC) on the same
# workload against the same server, one after the other, so the two clients' TTFT, inter-token
# latency and throughput can be read side by side (docs/openai-loadgen.md).
#
#   benchmarks/openai_loadgen.sh [--model DIR] [--rate R] [--requests N] [--prompt P] [--output O]
#
# Without --model it writes the small preset with make-model (a Hugging Face directory whose
# tokenizer.json GuideLLM loads to build prompts of exactly P tokens). Results go to
# ${OUT:-/tmp/moeserve-openai-loadgen}: guidellm.json, loadgen.json and summary.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="" RATE=2 REQUESTS=40 PROMPT=128 OUTPUT=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --prompt) PROMPT="$2"; shift 2 ;;
    --output) OUTPUT="$2"; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-/tmp/moeserve-openai-loadgen}"
VENV="${VENV:-$HOME/.cache/moeserve/guidellm-venv}"
BIN=build/tools/moeserve
mkdir -p "$OUT"
[[ -x "$BIN" ]] || scripts/build.sh
if [[ ! -x "$VENV/bin/guidellm" ]]; then
  echo "installing guidellm 0.3.1 into $VENV ..." >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet guidellm==0.3.1
fi
if [[ -z "$MODEL" ]]; then
  MODEL="$OUT/small"
  [[ -f "$MODEL/tokenizer.json" ]] || "$BIN" make-model --preset small --seed 0 --dtype bf16 --out "$MODEL" >&2
fi

rm -f "$OUT/port" "$OUT/http_port"
"$BIN" serve --model "$MODEL" --listen 127.0.0.1:0 --port-file "$OUT/port" --http-listen 127.0.0.1:0 \
  --http-port-file "$OUT/http_port" --served-model-name bench > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do [[ -s "$OUT/port" ]] && break; sleep 0.1; done
[[ -s "$OUT/port" ]] || { cat "$OUT/server.log" >&2; exit 1; }
PORT=$(cat "$OUT/port") HTTP_PORT=$(cat "$OUT/http_port")

echo "== GuideLLM (OpenAI HTTP, streaming): rate $RATE/s, $REQUESTS requests, $PROMPT prompt + $OUTPUT output tokens" >&2
"$VENV/bin/guidellm" benchmark --target "http://127.0.0.1:$HTTP_PORT" --model bench --processor "$MODEL" \
  --data "prompt_tokens=$PROMPT,output_tokens=$OUTPUT" --rate-type constant --rate "$RATE" \
  --max-requests "$REQUESTS" --random-seed 1 --output-path "$OUT/guidellm.json" --disable-progress >&2

echo "== moeserve loadgen (gRPC) on the same workload" >&2
"$BIN" loadgen --target "127.0.0.1:$PORT" --rate "$RATE" --num-requests "$REQUESTS" --prompt-len "$PROMPT" \
  --output-len "$OUTPUT" --out "$OUT/loadgen.json" --no-progress >&2

"$VENV/bin/python" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
gb = json.load(open(f"{out}/guidellm.json"))["benchmarks"][0]
g = gb["metrics"]
def gs(name, stat):
    d = g[name]["successful"]
    return d["percentiles"][stat] if stat.startswith("p") and stat != "median" else d[stat]
lv = json.load(open(f"{out}/loadgen.json"))["levels"][0]
rows = [("client", "requests ok", "output tokens/request", "ttft p50 ms", "ttft p99 ms", "itl p50 ms",
         "tpot p50 ms", "output tok/s"),
        ("guidellm 0.3.1 (OpenAI HTTP, SSE)", gb["request_totals"]["successful"], gs("output_token_count", "mean"),
         gs("time_to_first_token_ms", "median"), gs("time_to_first_token_ms", "p99"),
         gs("inter_token_latency_ms", "median"), gs("time_per_output_token_ms", "median"),
         g["output_tokens_per_second"]["successful"]["mean"]),
        ("moeserve loadgen (gRPC)", lv["ok"], lv["output_tokens"] / max(lv["ok"], 1), lv["ttft_ms"]["median"],
         lv["ttft_ms"]["p99"], lv["itl_ms"]["median"], lv["tpot_ms"]["median"], lv["output_throughput"])]
with open(f"{out}/summary.csv", "w") as f:
    for r in rows:
        f.write(",".join(str(x) for x in r) + "\n")
for r in rows:
    print(" | ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in r))
PY
