#!/usr/bin/env bash
# run.sh - the benchmark harness: one command that runs the benchmark programs by suite,
# measures the ceilings they are judged against and llama.cpp on the same model in the
# same run, and writes one JSON document, a table and PNG plots.
#
#   bench/run.sh [--quick] [--tiny] [--suite NAME]... [--out DIR] [--build DIR] [--bin-dir DIR]
#                [--model GGUF] [--threads N (default: every core)] [--no-build] [--no-install] [--no-plots]
#
# Suites (default: all, in this order):
#   ceilings  bench/ceilings: memcpy, single- and multi-threaded read bandwidth; with a CUDA
#             device also device-to-device and pinned host<->device copies, cuBLAS F32/BF16 GEMM
#   kernels   bench/kernel_bench: every CUDA kernel family vs the device copy (CUDA device only)
#   e2e       bench/e2e_bench on the GGUF (whole vs split, prefill and decode tokens/s, decode
#             weight bandwidth vs read_mt) and bench/llamacpp_peer.py: llama.cpp on the same
#             file, prompt, thread count and decode length
#   seams     bench/seam_bench: per-hop cost against residual size, per transport
#   pipeline  bench/pipeline_bench: tokens/s and stage bubbles vs sequences in flight
#   serve     bench/serve_bench.py: `meshkern serve` and llama-cpp-python's server (same GGUF,
#             threads and context, one after the other) under 1..32 concurrent streaming
#             clients: requests/s, tokens/s, time to first token p50/p99, and a plot
#   batch     bench/batch_bench.py: `meshkern run --prompts` with 1..64 copies of one prompt in one
#             batch and llama.cpp decoding as many sequences per llama_decode (same GGUF, threads,
#             prompt), in turn per N: decode tokens/s, per-sequence ms/token, prefill, and a plot
# A suite whose program is not in this tree, or whose hardware is absent, is reported as
# "not available" (table and JSON), not as an error.
#
# --quick: every suite, shorter runs (< 5 min on a 2-core CPU machine once built).
# --tiny:  the smallest meaningful run (tests use it: --suite ceilings --tiny).
# Outputs in --out (default bench/results): results.json, table.txt, *.png; the programs'
# raw outputs and logs in OUT/raw. Builds missing programs in --build (default build-bench,
# Release) unless --no-build or --bin-dir. Installs gnuplot (apt) and llama-cpp-python (pip;
# [server] for serve) when missing unless --no-install; neither is needed by the test suite.
# Exit: 0 every suite ran or was not available; 1 a case failed; 2 bad arguments.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALL_SUITES=(ceilings kernels e2e seams pipeline serve batch)
SUITES=() MODE=full OUTDIR="$ROOT/bench/results" BUILD="$ROOT/build-bench" BIN_DIR=""
# --threads: the engines' threads (meshkern and llama.cpp alike); read_mt always uses every core
CORES=$(nproc 2>/dev/null || echo 2)
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" THREADS=$CORES
DO_BUILD=1 DO_INSTALL=1 DO_PLOTS=1

usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) MODE=quick ;;
    --tiny) MODE=tiny ;;
    --suite) [ $# -ge 2 ] || usage; SUITES+=("$2"); shift ;;
    --out) [ $# -ge 2 ] || usage; OUTDIR=$2; shift ;;
    --build) [ $# -ge 2 ] || usage; BUILD=$2; shift ;;
    --bin-dir) [ $# -ge 2 ] || usage; BIN_DIR=$2; DO_BUILD=0; shift ;;
    --model) [ $# -ge 2 ] || usage; MODEL=$2; shift ;;
    --threads) [ $# -ge 2 ] || usage; THREADS=$2; shift ;;
    --no-build) DO_BUILD=0 ;;
    --no-install) DO_INSTALL=0 ;;
    --no-plots) DO_PLOTS=0 ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[ ${#SUITES[@]} -gt 0 ] || SUITES=("${ALL_SUITES[@]}")
for s in "${SUITES[@]}"; do
  case " ${ALL_SUITES[*]} " in *" $s "*) ;; *) echo "run.sh: unknown suite '$s' (${ALL_SUITES[*]})" >&2; exit 2 ;; esac
done
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --threads needs a positive integer" >&2; exit 2; }
# the meshkern CLI (serve suite) lives in tools/, next to bench/ in a build tree
if [ -n "$BIN_DIR" ] && [ ! -x "$BIN_DIR/meshkern" ] && [ -x "$BIN_DIR/../tools/meshkern" ]; then
  MK_BIN=$BIN_DIR/../tools/meshkern
elif [ -n "$BIN_DIR" ]; then
  MK_BIN=$BIN_DIR/meshkern
else
  MK_BIN=$BUILD/tools/meshkern
fi
BIN_DIR=${BIN_DIR:-$BUILD/bench}

# Sizes per mode: one table, read by every suite below. serve: concurrency levels, requests per
# client per level and tokens per request (full: 106 requests per server, < 10 min on 2 cores).
# batch: concurrent sequences, decode steps per sequence, the N of the unbatched run
# (--step-sequences 1) and runs per engine and N, the best counting (full: about 5 min on 2 cores).
case $MODE in
  full)  CEIL_BYTES=$((512 << 20)) CEIL_REPS=5 PROMPT=128 DECODE=128 RUNS=3 SEQS=8 PIPE_DECODE=16 PIPE_REPEATS=2
         SERVE_CLIENTS=1,4,16,32 SERVE_REQUESTS=2 SERVE_TOKENS=32
         BATCH_SEQS=1,2,4,8,16,32,64 BATCH_DECODE=64 BATCH_BASE=8 BATCH_RUNS=2 ;;
  quick) CEIL_BYTES=$((512 << 20)) CEIL_REPS=3 PROMPT=64 DECODE=32 RUNS=3 SEQS=4 PIPE_DECODE=8 PIPE_REPEATS=1
         SERVE_CLIENTS=1,4,16 SERVE_REQUESTS=1 SERVE_TOKENS=16
         BATCH_SEQS=1,4,16 BATCH_DECODE=16 BATCH_BASE=4 BATCH_RUNS=1 ;;
  tiny)  CEIL_BYTES=$((16 << 20)) CEIL_REPS=2 PROMPT=8 DECODE=8 RUNS=1 SEQS=2 PIPE_DECODE=4 PIPE_REPEATS=1
         SERVE_CLIENTS=1,2 SERVE_REQUESTS=1 SERVE_TOKENS=8
         BATCH_SEQS=1,2 BATCH_DECODE=4 BATCH_BASE=2 BATCH_RUNS=1 ;;
esac

RAW="$OUTDIR/raw"
rm -rf "$RAW"
mkdir -p "$RAW" || exit 2
MANIFEST="$RAW/manifest.tsv"
: >"$MANIFEST"
T_START=$(date +%s.%N)
cat /proc/loadavg >"$RAW/load_before" 2>/dev/null
{ echo "mode=$MODE"; echo "threads=$THREADS"; echo "model=$MODEL"; echo "prompt=$PROMPT"; echo "decode=$DECODE";
  echo "runs=$RUNS"; } >"$RAW/options"

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf '[bench +%6ss] %s\n' "$(since "$T_START")" "$*"; }
# record SUITE CASE STATUS ELAPSED REASON  (one manifest row; the aggregator reads them)
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5//$'\t'/ }" >>"$MANIFEST"; }
unavailable() { say "$1 / $2: not available ($3)"; record "$1" "$2" "not available" 0 "$3"; }

# run_case SUITE CASE TIMEOUT_S cmd... : runs with OUT=RAW/SUITE, logs to RAW/SUITE/CASE.log,
# prints a progress line before and after (suite, case, elapsed).
FAILED=0
run_case() {
  local suite=$1 name=$2 limit=$3 t0 rc el
  shift 3
  mkdir -p "$RAW/$suite"
  say "$suite / $name: running"
  t0=$(date +%s.%N)
  OUT="$RAW/$suite" timeout "$limit" "$@" >"$RAW/$suite/$name.log" 2>&1
  rc=$?
  el=$(since "$t0")
  if [ $rc -eq 0 ]; then
    say "$suite / $name: ok (${el} s)"
    record "$suite" "$name" ok "$el" ""
  else
    local why="exit $rc"
    [ $rc -eq 124 ] && why="timed out after ${limit} s"
    why="$why: $(grep -v '^\s*$' "$RAW/$suite/$name.log" | tail -n 1 | cut -c1-200)"
    say "$suite / $name: FAILED ($why; log $RAW/$suite/$name.log)"
    record "$suite" "$name" failed "$el" "$why"
    FAILED=1
  fi
  return $rc
}

# ---- tools: gnuplot and the peer (installed once; cached by apt and pip) -------------------
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
if [ $DO_PLOTS -eq 1 ] && ! command -v gnuplot >/dev/null 2>&1 && [ $DO_INSTALL -eq 1 ]; then
  say "installing gnuplot-nox (plots)"
  asroot=()
  [ "$(id -u)" = 0 ] || asroot=(sudo -n)
  # shellcheck disable=SC2024 # the log is ours; only apt-get needs root
  "${asroot[@]}" apt-get install -y gnuplot-nox >"$RAW/apt.log" 2>&1 || say "gnuplot not installed: no plots"
fi
# the e2e peer needs llama_cpp; the serve suite's also its server (uvicorn, fastapi: the [server] extra)
peer_modules="llama_cpp, numpy" peer_pkg=llama-cpp-python need_peer=0
for s in "${SUITES[@]}"; do
  [ "$s" = e2e ] || [ "$s" = batch ] && need_peer=1
  [ "$s" = serve ] && need_peer=1 peer_modules="llama_cpp, numpy, uvicorn, llama_cpp.server.app" \
    peer_pkg="llama-cpp-python[server]"
done
peer_ready() { python3 -c "import $peer_modules" >/dev/null 2>&1; }
if [ $need_peer -eq 1 ] && ! peer_ready && [ $DO_INSTALL -eq 1 ]; then
  # CPU build from source on first use; with a GPU, llama.cpp's CUDA build if it compiles.
  say "installing $peer_pkg (the e2e and serve peer; pip caches the build)"
  # A CPU that lists AMX may not let a process use it (a VM without the tile state): llama.cpp's
  # -march=native build then dies with SIGILL on its first matmul. Build it without AMX there,
  # and not from pip's cache, which may hold a -march=native wheel.
  no_amx="" pip_opts=(--retries 1 --timeout 20)
  if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    no_amx='-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"'
    pip_opts+=(--no-cache-dir)
  fi
  if have_gpu && command -v nvcc >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_CUDA=on $no_amx" timeout 900 python3 -m pip install "${pip_opts[@]}" "$peer_pkg" numpy >"$RAW/pip.log" 2>&1 ||
      say "llama-cpp-python CUDA build failed; trying the CPU build"
  fi
  peer_ready || CMAKE_ARGS="$no_amx" timeout 900 python3 -m pip install "${pip_opts[@]}" "$peer_pkg" numpy >>"$RAW/pip.log" 2>&1 ||
    CMAKE_ARGS="$no_amx" timeout 900 python3 -m pip install "${pip_opts[@]}" --break-system-packages "$peer_pkg" numpy \
      >>"$RAW/pip.log" 2>&1 ||
    say "$peer_pkg could not be installed (see $RAW/pip.log)"
fi

# ---- build what is missing ---------------------------------------------------------------
# Programs by suite; a source absent from this tree means the suite is not available.
prog_src() { case $1 in ceilings) echo bench/ceilings.c ;; kernel_bench) echo bench/kernel_bench.cpp ;;
  e2e_bench) echo bench/e2e_bench.c ;; seam_bench) echo bench/seam_bench.c ;; pipeline_bench) echo bench/pipeline_bench.c ;;
  meshkern_cli) echo tools/meshkern.c ;; esac; }
# where a program is once built (the CMake target meshkern_cli is the meshkern binary)
prog_bin() { if [ "$1" = meshkern_cli ]; then echo "$MK_BIN"; else echo "$BIN_DIR/$1"; fi; }
want=()
for s in "${SUITES[@]}"; do
  case $s in
    ceilings) want+=(ceilings) ;;
    kernels) have_gpu && want+=(kernel_bench) ;;
    e2e) want+=(e2e_bench) ;;
    seams) want+=(seam_bench) ;;
    pipeline) want+=(pipeline_bench) ;;
    serve|batch) want+=(meshkern_cli) ;;
  esac
done
missing=()
for p in "${want[@]}"; do
  [ -f "$ROOT/$(prog_src "$p")" ] && [ ! -x "$(prog_bin "$p")" ] && missing+=("$p")
done
if [ $DO_BUILD -eq 1 ] && [ ${#missing[@]} -gt 0 ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cuda=OFF
    have_gpu && command -v nvcc >/dev/null 2>&1 && cuda=ON
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    say "configure $BUILD (Release, CUDA $cuda)"
    cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMESHKERN_CUDA=$cuda -DMESHKERN_TESTS=OFF \
      >"$RAW/configure.log" 2>&1 || say "configure failed (see $RAW/configure.log)"
  fi
  for p in "${missing[@]}"; do
    say "build $p"
    cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" --target "$p" >>"$RAW/build.log" 2>&1 ||
      say "build of $p failed (see $RAW/build.log)"
  done
fi
# ceilings is self-contained: without the CMake project (a bare GPU image) build it directly.
if [ ! -x "$BIN_DIR/ceilings" ] && [ -f "$ROOT/bench/ceilings.c" ] && [[ " ${want[*]} " == *" ceilings "* ]]; then
  CEIL_BIN="$RAW/ceilings-standalone"
  cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
  if have_gpu && [ -f "$cuda_home/include/cuda_runtime.h" ]; then
    cc -O3 -std=c11 -D_GNU_SOURCE -DMK_CEILINGS_CUDA -I"$cuda_home/include" "$ROOT/bench/ceilings.c" \
      -L"$cuda_home/lib64" -Wl,-rpath,"$cuda_home/lib64" -lcublas -lcudart -pthread -o "$CEIL_BIN" >>"$RAW/build.log" 2>&1
  else
    cc -O3 -std=c11 -D_GNU_SOURCE "$ROOT/bench/ceilings.c" -pthread -o "$CEIL_BIN" >>"$RAW/build.log" 2>&1
  fi
else
  CEIL_BIN="$BIN_DIR/ceilings"
fi
bin() { if [ "$1" = ceilings ]; then echo "$CEIL_BIN"; else prog_bin "$1"; fi; }

# is_available SUITE CASE PROG : prints the reason and records when the program cannot run
is_available() {
  local suite=$1 name=$2 p=$3 path
  path=$(bin "$p")
  if [ ! -f "$ROOT/$(prog_src "$p")" ]; then unavailable "$suite" "$name" "$p is not in this tree yet"; return 1; fi
  if [ ! -x "$path" ] && [ $DO_BUILD -eq 0 ]; then  # the caller chose not to build it
    unavailable "$suite" "$name" "$p is not built ($path) and --no-build/--bin-dir was given"
    return 1
  fi
  if [ ! -x "$path" ]; then
    say "$suite / $name: FAILED ($p did not build; see $RAW/build.log)"
    record "$suite" "$name" failed 0 "$p did not build (see raw/build.log)"
    FAILED=1
    return 1
  fi
  return 0
}
# gpu_check.sh's standalone nvcc build has its own kernel_bench
kbin() { echo "${MK_BENCH_KERNEL_BIN:-$BIN_DIR/kernel_bench}"; }

# ---- suites ------------------------------------------------------------------------------------
for suite in "${SUITES[@]}"; do
  case $suite in
    ceilings)
      is_available ceilings host ceilings &&
        run_case ceilings host 300 "$CEIL_BIN" --bytes "$CEIL_BYTES" --threads "$CORES" --reps "$CEIL_REPS" \
          --json "$RAW/ceilings/ceilings.json"
      ;;
    kernels)
      if ! have_gpu; then unavailable kernels cuda "no CUDA device (kernel_bench times the CUDA kernels)"
      elif [ ! -x "$(kbin)" ]; then unavailable kernels cuda "kernel_bench is not built (see raw/build.log)"; FAILED=1
      else run_case kernels cuda 300 "$(kbin)" "$RAW/kernels"; fi
      ;;
    e2e)
      if [ ! -f "$MODEL" ]; then unavailable e2e meshkern "no model at $MODEL (scripts/fetch_model.sh)"; continue; fi
      if is_available e2e meshkern-cpu e2e_bench; then
        extra=()
        # issue 16's e2e_bench takes --threads/--runs; older ones use the backend's default threads
        if "$BIN_DIR/e2e_bench" --help 2>&1 | grep -q -- '--threads'; then extra=(--threads "$THREADS" --runs "$RUNS"); fi
        OPENBLAS_NUM_THREADS=$THREADS run_case e2e meshkern-cpu 600 "$BIN_DIR/e2e_bench" "$MODEL" cpu "$PROMPT" "$DECODE" \
          "${extra[@]}"
        [ -f "$RAW/e2e/e2e_bench.json" ] && mv "$RAW/e2e/e2e_bench.json" "$RAW/e2e/meshkern-cpu.json"
        if have_gpu && grep -q 'MESHKERN_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
          run_case e2e meshkern-cuda 600 "$BIN_DIR/e2e_bench" "$MODEL" cuda "$PROMPT" "$DECODE" "${extra[@]}"
          [ -f "$RAW/e2e/e2e_bench.json" ] && mv "$RAW/e2e/e2e_bench.json" "$RAW/e2e/meshkern-cuda.json"
        fi
      fi
      if ! peer_ready; then unavailable e2e llama.cpp "llama-cpp-python is not installed (run without --no-install)"
      elif [ ! -f "$ROOT/bench/llamacpp_peer.py" ]; then unavailable e2e llama.cpp "bench/llamacpp_peer.py is missing"
      else
        ids=$(python3 "$ROOT/bench/aggregate.py" prompt-ids "$MODEL" "$PROMPT") || ids=""
        if run_case e2e llama.cpp 600 python3 "$ROOT/bench/llamacpp_peer.py" "$MODEL" --threads "$THREADS" \
             --tokens "$DECODE" --runs "$RUNS" ${ids:+--prompt-ids "$ids"}; then
          grep '^{' "$RAW/e2e/llama.cpp.log" | tail -n 1 >"$RAW/e2e/llama.cpp.json"
        fi
      fi
      ;;
    seams)
      is_available seams seam_bench seam_bench && run_case seams seam_bench 300 "$BIN_DIR/seam_bench"
      ;;
    pipeline)
      if [ ! -f "$MODEL" ]; then unavailable pipeline cpu "no model at $MODEL"; continue; fi
      is_available pipeline cpu pipeline_bench &&
        run_case pipeline cpu 600 "$BIN_DIR/pipeline_bench" "$MODEL" cpu "$SEQS" "$PIPE_DECODE" "$PIPE_REPEATS"
      ;;
    serve)
      if [ ! -f "$MODEL" ]; then unavailable serve load "no model at $MODEL"; continue; fi
      is_available serve load meshkern_cli || continue
      if ! "$MK_BIN" serve --help 2>&1 | grep -q -- '--max-sequences'; then
        unavailable serve load "$MK_BIN has no serve command (built without libmicrohttpd/libcjson)"; continue
      fi
      plot=()
      [ $DO_PLOTS -eq 1 ] && plot=(--plot "$RAW/serve/serve_load.png")
      # both servers in one case, one after the other; serve_bench says when the peer is missing
      run_case serve load 900 python3 "$ROOT/bench/serve_bench.py" --meshkern "$MK_BIN" --model "$MODEL" \
        --threads "$THREADS" --peer llama-cpp --clients "$SERVE_CLIENTS" --requests "$SERVE_REQUESTS" \
        --max-tokens "$SERVE_TOKENS" --json "$RAW/serve/serve_bench.json" --log-dir "$RAW/serve" "${plot[@]}"
      # a peer that could not run is a row of its own in the table, not hidden inside the case
      why=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["servers"].get("llama-cpp-python", "")
print(p[len("unavailable: "):] if isinstance(p, str) and p.startswith("unavailable: ") else "")' \
        "$RAW/serve/serve_bench.json" 2>/dev/null)
      [ -n "$why" ] && unavailable serve llama-cpp-python "$why"
      ;;
    batch)
      if [ ! -f "$MODEL" ]; then unavailable batch cpu "no model at $MODEL"; continue; fi
      is_available batch cpu meshkern_cli || continue
      if ! "$MK_BIN" run --help 2>&1 | grep -q -- '--step-sequences'; then
        unavailable batch cpu "$MK_BIN run has no --step-sequences (built before batched decode)"; continue
      fi
      plot=()
      [ $DO_PLOTS -eq 1 ] && plot=(--plot "$RAW/batch/batch_decode.png")
      # both engines in one case, in turn per N; batch_bench says when the peer is missing
      run_case batch cpu 900 python3 "$ROOT/bench/batch_bench.py" --meshkern "$MK_BIN" --model "$MODEL" \
        --threads "$THREADS" --sequences "$BATCH_SEQS" --decode "$BATCH_DECODE" --baseline-n "$BATCH_BASE" \
        --runs "$BATCH_RUNS" --json "$RAW/batch/batch_bench.json" --log-dir "$RAW/batch" "${plot[@]}"
      why=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])).get("llama.cpp", "")
print(p[len("unavailable: "):] if isinstance(p, str) and p.startswith("unavailable: ") else "")' \
        "$RAW/batch/batch_bench.json" 2>/dev/null)
      [ -n "$why" ] && unavailable batch llama.cpp "$why"
      ;;
  esac
done
cat /proc/loadavg >"$RAW/load_after" 2>/dev/null

# ---- one document, the table, the plots -----------------------------------------------------
plots=()
# without gnuplot the aggregator still copies the serve suite's plot (matplotlib) into OUTDIR
[ $DO_PLOTS -eq 1 ] && plots=(--plots "$OUTDIR")
python3 "$ROOT/bench/aggregate.py" collect "$RAW" --root "$ROOT" --json "$OUTDIR/results.json" "${plots[@]}" ||
  { echo "run.sh: the aggregator failed" >&2; exit 1; }
python3 "$ROOT/bench/aggregate.py" table "$OUTDIR/results.json" | tee "$OUTDIR/table.txt"
say "done: $OUTDIR/results.json"
exit $FAILED
