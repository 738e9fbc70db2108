#!/usr/bin/env bash
# Builds the libFuzzer target fuzz/http_fuzz.cc (request bodies through ParseJsonBody,
# IntInRange and ParseCompletion, refusals and answers serialised as the server does) with
# clang++ -fsanitize=fuzzer,address,undefined, and runs it on the committed corpus for a bounded
# time. Not part of the CMake build or CI: the project's libraries are built with GCC and
# without coverage instrumentation, so the few sources the target needs are compiled here, with
# clang, into BUILD_DIR (default build-fuzz/, git-ignored). See fuzz/README.md.
#
# Usage: benchmarks/fuzz_http.sh [SECONDS (default 120)] [extra libFuzzer flags...]
# (with fuzz/http.dict: JSON syntax and the API's names)
#   BUILD_DIR=build-fuzz   where objects, the binary, the working corpus and findings go
#   CXX=clang++            the compiler (clang 14 or later, with libFuzzer)
#   JOBS=2                 parallel compiles
#   CONTINUE=1             go on past an exception escaping the parser (the server would die of
#                          it, but the same one is found within seconds): each new kind is saved
#                          once to BUILD_DIR/findings/exception-* (MOESERVE_FUZZ_CONTINUE)
#   FORK=N                 run N fuzzing processes that go on past a crash (-fork=N
#                          -ignore_crashes=1); findings are written to BUILD_DIR/findings/
#   BUILD_ONLY=1           build, do not run
# After a run, every finding is replayed without CONTINUE and summarised: the first frame in
# moeserve's sources and what the crash says.
# A crash input can be replayed with: BUILD_DIR/http_fuzz FILE
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SECONDS_TO_RUN=${1:-120}
shift || true
BUILD_DIR=${BUILD_DIR:-build-fuzz}
CXX=${CXX:-clang++}
JOBS=${JOBS:-2}
mkdir -p "$BUILD_DIR/obj" "$BUILD_DIR/corpus" "$BUILD_DIR/findings"

# What ParseCompletion, the chat template and the response objects need: the request's
# validation and sampling parameters (and the sampler those pull in), none of the engine's
# scheduling, the model kernels or the server's transport.
SOURCES=(
  server/json_body.cc server/openai_protocol.cc server/openai_fields.cc server/openai_options.cc
  server/openai_sampling.cc server/request_stream.cc
  engine/request_validation.cc engine/sampling.cc engine/priority.cc kernels/cpu/sample_ops.cc
  models/model_config.cc models/config_json.cc models/model_params.cc models/model_presets.cc
  models/deepseek_config.cc models/qwen_config.cc models/quantization_config.cc
  text/utf8_chars.cc text/regex.cc text/tokenizer.cc text/model_tokenizer.cc text/tokenizer_files.cc
  text/stream_detokenizer.cc text/hf_tokenizer.cc text/hf_text.cc text/hf_decoder.cc text/bpe.cc
  text/sp_tokenizer.cc text/sp_processor.cc
  text/jinja_value.cc text/jinja_lexer.cc text/jinja_parser.cc text/jinja_expressions.cc
  text/jinja_builtins.cc text/jinja_filters.cc text/jinja_helpers.cc text/jinja_template.cc
  core/file_util.cc core/dtype.cc
)
# The response objects live beside the parser in some revisions.
[ -f server/openai_responses.cc ] && SOURCES+=(server/openai_responses.cc)

# -O1 with frame pointers for readable stacks; UB aborts (no recovery) so libFuzzer reports it.
# The sentencepiece module is never loaded (the byte tokenizer is used), hence the dummy path.
FLAGS=(-std=c++20 -g -O1 -fno-omit-frame-pointer -I"$ROOT" -march=x86-64-v3
       -DMOESERVE_SP_MODULE=\"/nonexistent/libmoeserve_sp.so\"
       -fsanitize=address,undefined -fno-sanitize-recover=undefined -Wno-unused-command-line-argument)

# Objects are rebuilt when their source or any of the project's headers changes (conservative:
# no dependency files), or all of them when the flags do.
if [ "$(cat "$BUILD_DIR/obj/flags" 2>/dev/null)" != "$CXX ${FLAGS[*]}" ]; then
  rm -f "$BUILD_DIR"/obj/*.o
  echo "$CXX ${FLAGS[*]}" > "$BUILD_DIR/obj/flags"
fi
compile() {  # SRC OBJ [extra flags]
  local src=$1 obj=$2
  shift 2
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] ||
     [ -n "$(find "$ROOT/server" "$ROOT/engine" "$ROOT/models" "$ROOT/core" "$ROOT/text" "$ROOT/kernels" -name '*.h' -newer "$obj" -print -quit)" ]; then
    echo "  $CXX $src"
    "$CXX" "${FLAGS[@]}" "$@" -c "$src" -o "$obj"
  fi
}
echo "fuzz_http: compiling ${#SOURCES[@]} sources and the target into $BUILD_DIR/ with $($CXX --version | head -1)"
OBJS=()
pids=()
for src in "${SOURCES[@]}"; do
  obj="$BUILD_DIR/obj/$(echo "$src" | tr '/' '_').o"
  OBJS+=("$obj")
  compile "$src" "$obj" -fsanitize=fuzzer-no-link &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$JOBS" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
compile fuzz/http_fuzz.cc "$BUILD_DIR/obj/http_fuzz.o" -fsanitize=fuzzer
compile fuzz/json_mutator.cc "$BUILD_DIR/obj/json_mutator.o" -fsanitize=fuzzer-no-link
LIBS=$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format libpcre2-8 libutf8proc)
"$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "$BUILD_DIR/obj/http_fuzz.o" "$BUILD_DIR/obj/json_mutator.o" "${OBJS[@]}" \
  $LIBS -lxxhash -ldl -pthread \
  -o "$BUILD_DIR/http_fuzz"
echo "fuzz_http: built $BUILD_DIR/http_fuzz"
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

# The committed seeds stay as they are; what the fuzzer adds goes to BUILD_DIR/corpus.
RUN=(-max_total_time="$SECONDS_TO_RUN" -max_len=16384 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
     -dict=fuzz/http.dict -artifact_prefix="$BUILD_DIR/findings/")
if [ -n "${FORK:-}" ]; then
  RUN+=(-fork="$FORK" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi
if [ "${CONTINUE:-0}" = 1 ]; then
  export MOESERVE_FUZZ_CONTINUE="$ROOT/$BUILD_DIR/findings"
fi
echo "fuzz_http: running for $SECONDS_TO_RUN s on fuzz/corpus/http (+ $BUILD_DIR/corpus)"
set +e
"$BUILD_DIR/http_fuzz" "${RUN[@]}" "$@" "$BUILD_DIR/corpus" fuzz/corpus/http
rc=$?
set -e
unset MOESERVE_FUZZ_CONTINUE

# Each finding replayed alone: where it happens and what it says.
findings=$(ls -t "$BUILD_DIR/findings" | head -200 || true)
echo "fuzz_http: exit $rc; findings in $BUILD_DIR/findings/: $(ls "$BUILD_DIR/findings" | wc -l)"
for f in $findings; do
  out=$("$BUILD_DIR/http_fuzz" "$BUILD_DIR/findings/$f" 2>&1 || true)
  where=$(grep -a -E "^ +#[0-9]+ .* $ROOT/(server|models|engine|core)/" <<<"$out" | head -1 || true)
  [ -n "$where" ] || where=$(grep -a -E "^ +#[0-9]+ .* $ROOT/fuzz/" <<<"$out" | grep -v LLVMFuzzerInitialize | head -1 || true)
  where=$(sed -E "s|.* in ||; s|$ROOT/||" <<<"$where")
  what=$(grep -a -E "what\(\)|runtime error|ERROR: AddressSanitizer|ERROR: LeakSanitizer|FUZZ_CHECK|ERROR: libFuzzer: (timeout|out-of-memory)" <<<"$out" | head -1 | sed -E 's/^ +//' || true)
  stage=$(grep -a -E "^escaped from: " <<<"$out" | head -1 | cut -c15-200 || true)
  echo "  $f: ${what:-no crash on replay} at ${where:-?}${stage:+; escaped from: $stage}"
done
exit $rc
