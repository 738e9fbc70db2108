#!/usr/bin/env bash
# Drives moeserve's OpenAI-compatible HTTP API with the well-known third-party load generators,
# each pinned in its own virtualenv (from PyPI; not in CI): GuideLLM 0.8.1 (the vLLM project's),
# NVIDIA's aiperf 0.13.0, and, when VLLM_VENV names the virtualenv of vLLM's CPU build
# (../shared/peer/vllm/install.sh), `vllm bench serve`; then `moeserve loadgen` over gRPC. All run
# the same workload against the same server, one after the other, so their TTFT, inter-token
# latency and throughput can be read side by side (docs/openai-loadgen.md).
#
#   benchmarks/openai_loadgen.sh [--model DIR] [--rate R] [--requests N] [--prompt P] [--output O] [--rounds K]
#
# Without --model it writes the small preset with make-model (a Hugging Face directory whose
# tokenizer.json the clients load to build prompts of exactly P tokens). Results go to
# ${OUT:-/tmp/moeserve-openai-loadgen}: each client's report per round and summary.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="" RATE=2 REQUESTS=40 PROMPT=128 OUTPUT=64 ROUNDS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --prompt) PROMPT="$2"; shift 2 ;;
    --output) OUTPUT="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-/tmp/moeserve-openai-loadgen}"
CACHE="${CACHE:-$HOME/.cache/moeserve}"
BIN=build/tools/moeserve
mkdir -p "$OUT"
[[ -x "$BIN" ]] || scripts/build.sh
install() {  # venv, package==version, binary
  if [[ ! -x "$1/bin/$3" ]]; then
    echo "installing $2 into $1 ..." >&2
    python3 -m venv "$1"
    "$1/bin/pip" install --quiet "$2"
  fi
}
GUIDELLM="$CACHE/guidellm-0.8.1-venv" AIPERF="$CACHE/aiperf-0.13.0-venv"
install "$GUIDELLM" guidellm==0.8.1 guidellm
install "$AIPERF" aiperf==0.13.0 aiperf
if [[ -z "$MODEL" ]]; then
  MODEL="$OUT/small"
  [[ -f "$MODEL/tokenizer.json" ]] || "$BIN" make-model --preset small --seed 0 --dtype bf16 --out "$MODEL" >&2
fi

rm -f "$OUT/port" "$OUT/http_port"
"$BIN" serve "$MODEL" --listen 127.0.0.1:0 --port-file "$OUT/port" --http-listen 127.0.0.1:0 \
  --http-port-file "$OUT/http_port" --served-model-name bench > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do [[ -s "$OUT/port" ]] && break; sleep 0.1; done
[[ -s "$OUT/port" ]] || { cat "$OUT/server.log" >&2; exit 1; }
PORT=$(cat "$OUT/port") HTTP_PORT=$(cat "$OUT/http_port")
URL="http://127.0.0.1:$HTTP_PORT"

for r in $(seq "$ROUNDS"); do
  echo "== round $r: rate $RATE/s, $REQUESTS requests, $PROMPT prompt + $OUTPUT output tokens" >&2
  cat > "$OUT/guidellm-scenario.json" <<JSON
{"spec": {"backend": {"kind": "openai_http", "target": "$URL", "model": "bench", "request_format": "/v1/completions"},
  "profile": {"kind": "constant", "rate": $RATE},
  "data": [{"kind": "synthetic_text", "prompt_tokens": $PROMPT, "output_tokens": $OUTPUT}],
  "constraints": [{"kind": "max_requests", "count": $REQUESTS}],
  "tokenizer": {"kind": "huggingface_auto", "model": "$MODEL"},
  "outputs": [{"kind": "json", "path": "$OUT/guidellm-$r.json"}]}}
JSON
  echo "-- GuideLLM 0.8.1 (OpenAI HTTP, SSE)" >&2
  "$GUIDELLM/bin/guidellm" run -c "$OUT/guidellm-scenario.json" --disable-console > "$OUT/guidellm-$r.log" 2>&1
  echo "-- aiperf 0.13.0 (OpenAI HTTP, SSE)" >&2
  rm -rf "$OUT/aiperf-$r"
  "$AIPERF/bin/aiperf" profile --model bench --url "$URL" --endpoint-type completions --streaming \
    --tokenizer "$MODEL" --isl "$PROMPT" --osl "$OUTPUT" --extra-inputs ignore_eos:true --request-rate "$RATE" \
    --request-count "$REQUESTS" --artifact-dir "$OUT/aiperf-$r" --ui-type none > "$OUT/aiperf-$r.log" 2>&1
  if [[ -n "${VLLM_VENV:-}" ]]; then
    echo "-- vllm bench serve (OpenAI HTTP, SSE)" >&2
    # Prompts of PROMPT - 1 random ASCII characters: PROMPT tokens with BOS under the byte tokenizer.
    "$VLLM_VENV/bin/python" ../shared/peer/vllm/make_ascii_prompts.py "$OUT/prompts.jsonl" "$r" "$REQUESTS" $((PROMPT - 1))
    HF_HUB_OFFLINE=1 "$VLLM_VENV/bin/python" ../shared/peer/vllm/vllm_cli.py bench serve --backend vllm --base-url "$URL" \
      --model bench --tokenizer "$MODEL" --dataset-name custom --dataset-path "$OUT/prompts.jsonl" \
      --custom-output-len "$OUTPUT" --skip-chat-template --ignore-eos --request-rate "$RATE" --num-prompts "$REQUESTS" \
      --save-result --result-dir "$OUT" --result-filename "vllm-$r.json" > "$OUT/vllm-$r.log" 2>&1
  fi
  echo "-- moeserve loadgen (gRPC)" >&2
  "$BIN" loadgen --target "127.0.0.1:$PORT" --rate "$RATE" --num-requests "$REQUESTS" --prompt-len "$PROMPT" \
    --output-len "$OUTPUT" --out "$OUT/loadgen-$r.json" --no-progress >&2
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = [("round", "client", "requests ok", "output tokens/request", "ttft p50 ms", "ttft p99 ms", "itl p50 ms",
         "output tok/s")]
for r in range(1, rounds + 1):
    g = json.load(open(f"{out}/guidellm-{r}.json"))["benchmarks"][0]["metrics"]
    gs = lambda name, stat: g[name]["successful"]["percentiles"][stat]
    rows.append((r, "GuideLLM 0.8.1", g["request_totals"]["successful"], g["output_token_count"]["successful"]["mean"],
                 gs("time_to_first_token_ms", "p50"), gs("time_to_first_token_ms", "p99"),
                 gs("inter_token_latency_ms", "p50"), g["output_tokens_per_second"]["successful"]["mean"]))
    a = json.load(open(f"{out}/aiperf-{r}/profile_export_aiperf.json"))
    rows.append((r, "aiperf 0.13.0", a["request_count"]["avg"], a["output_sequence_length"]["avg"],
                 a["time_to_first_token"]["p50"], a["time_to_first_token"]["p99"], a["inter_token_latency"]["p50"],
                 a["output_token_throughput"]["avg"]))
    if os.path.exists(f"{out}/vllm-{r}.json"):
        v = json.load(open(f"{out}/vllm-{r}.json"))
        rows.append((r, "vllm bench serve 0.32", v["completed"], v["total_output_tokens"] / max(v["completed"], 1),
                     v["median_ttft_ms"], v["p99_ttft_ms"], v["median_itl_ms"], v["output_throughput"]))
    lv = json.load(open(f"{out}/loadgen-{r}.json"))["levels"][0]
    rows.append((r, "moeserve loadgen (gRPC)", lv["ok"], lv["output_tokens"] / max(lv["ok"], 1), lv["ttft_ms"]["median"],
                 lv["ttft_ms"]["p99"], lv["itl_ms"]["median"], lv["output_throughput"]))
with open(f"{out}/summary.csv", "w") as f:
    for row in rows:
        f.write(",".join(str(x) for x in row) + "\n")
for row in rows:
    print(" | ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in row))
PY
