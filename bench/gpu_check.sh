#!/usr/bin/env bash
# gpu_check.sh - the one command a lent GPU machine runs: turn a few minutes of device time
# into figures and failures that come back.
#
#   bench/gpu_check.sh [build-dir]
#   env: OUT (where the results go: the device tool's $OUT), MK_GPU_BUNDLE (the bundle, an
#        archive or an unpacked meshkern-gpu/ folder; default ./gpu_bundle.tar.xz when present), MK_GPU_BUDGET_S (default 420: later steps are
#        skipped, and say so, once it is spent), MK_GPU_ARCHS (source build; default 90), JOBS,
#        MK_GPU_CHECK_DRY=1 (no GPU: run every step anyway, to try this script)
#
# Binaries, first found wins: (1) the carried bundle (scripts/gpu_bundle.sh: built on a
# development machine; the device image has no -dev packages and no network), unpacked and
# preflighted (every library it needs, by name, found or missing; CUDA's own from the image);
# (2) a CMake build where the -dev packages exist; (3) a standalone nvcc build of the kernels,
# the CPU reference and kernel_bench (the last resort; no test suites).
#
# Results: every log, XML and JSON is written straight into $OUT/results and the summary
# ($OUT/summary.txt: failures first, then every figure with its ceiling) is rewritten after each
# step, so a run the device tool kills at its limit still brings back everything done until
# then; at the end the folder is packed into $OUT/gpu_check.tgz and the summary printed last
# (inside the device tool's last 12,000 characters of output). Give the device call a limit
# about 120 s above MK_GPU_BUDGET_S (unpacking, the step running when the budget ends, packing).
# Steps, most valuable first: preflight (nvidia-smi -q, libraries), device suites (op grid,
# cuda backend, placed pipeline: gtest XML), decode on random llamas of SmolLM2's shape (30
# layers) and an 8B shape (4 layers) in f32 and bf16, eager vs graphs, batched decode at 1..64
# sequences on both shapes (bench/batch_bench.py: issue 27's tok/s against one sequence), the
# decode GEMVs and prefill attention vs cuBLAS (kernel_bench), compute-sanitizer memcheck +
# racecheck on decode attention, tensor-core prefill and GEMV (misaligned shapes too), NCCL,
# two ranges on one device (pipeline_bench --random-llama), the harness's device ceiling, an
# ncu kernel table of one decode run.
# Exit: 0 all passed; 1 a check failed; 2 no GPU (after the preflight); 3 no binaries.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu-check}
FINAL=${OUT:-$BUILD/gpu_check}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshkern-gpu-check.XXXXXX") # the unpacked bundle
R="$FINAL/results" # every log, XML and JSON, where the device tool brings it back; packed at the end
rm -rf "$R"
# the device image may set CI=true: the real-model tests would then fail for the model that is
# not carried (98 MB) instead of skipping (tests/mk_test_util.h)
unset CI MESHKERN_REQUIRE_MODEL
BUDGET=${MK_GPU_BUDGET_S:-420}
ARCHS=${MK_GPU_ARCHS:-90}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
START=$SECONDS
mkdir -p "$R" "$FINAL"
: >"$R/failures.txt"
: >"$R/figures.txt"
: >"$R/steps.txt"
log() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*"; }
failure() { printf '%s\n' "$*" >>"$R/failures.txt"; log "FAIL: $*"; }
figure() { printf '%s\n' "$*" >>"$R/figures.txt"; }
status=0
BIN_FROM="none" # set here: the summary may be written (a TERM) before the binaries are found

summary() { # $OUT/summary.txt from what is done so far (rc: the exit, or "running")
  local rc=$1 pass fail skip
  pass=$(awk '$2 == "PASS"' "$R/steps.txt" | wc -l); fail=$(awk '$2 == "FAIL"' "$R/steps.txt" | wc -l)
  skip=$(awk '$2 == "SKIP"' "$R/steps.txt" | wc -l)
  {
    echo "==== meshkern gpu_check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - START)) s, exit $rc)"
    echo "binaries: $BIN_FROM"
    [ -s "$R/gpu.txt" ] && sed 's/^/gpu: /' "$R/gpu.txt"
    echo "steps: $pass passed, $fail failed, $skip skipped"
    if [ -s "$R/failures.txt" ]; then echo "---- failures"; cat "$R/failures.txt"; fi
    echo "---- steps"; cat "$R/steps.txt"
    if [ -s "$R/figures.txt" ]; then echo "---- figures (with the ceiling each is judged against)"; cat "$R/figures.txt"; fi
  } >"$R/summary.txt"
  cp "$R/summary.txt" "$FINAL/summary.txt"
}

finish() { # write the summary, pack the results, print the summary
  local rc=$1
  trap - TERM INT
  summary "$rc"
  tar -C "$FINAL" -czf "$FINAL/gpu_check.tgz" results 2>/dev/null && rm -rf "$R"
  echo
  cat "$FINAL/summary.txt"
  echo "(all results: $FINAL/gpu_check.tgz)"
  rm -rf "$WORK"
  exit "$rc"
}
# killed at the device tool's limit: what is done still comes back, summarized
STEP_PID=
trap '[ -n "$STEP_PID" ] && kill -TERM "$STEP_PID" 2>/dev/null
      failure "gpu_check was stopped by a signal at $((SECONDS - START)) s"; finish 124' TERM INT

# step NAME TIMEOUT CMD... : run one check with its log in $R/NAME.log, unless the budget is spent.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then
    echo "$name SKIP (budget of ${BUDGET}s spent)" >>"$R/steps.txt"; log "skip $name: budget spent"; return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name (limit ${limit}s)"
  local t0=$SECONDS
  # in the background, waited for: a TERM then runs the trap at once, not after the step
  timeout --kill-after=10 "$limit" "$@" >"$R/$name.log" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  local rc=$?
  STEP_PID=
  if [ $rc -eq 0 ]; then
    echo "$name PASS $((SECONDS - t0))s" >>"$R/steps.txt"
  else
    [ $rc -eq 124 ] && rc="$rc (timed out at ${limit}s)"
    echo "$name FAIL rc $rc $((SECONDS - t0))s" >>"$R/steps.txt"
    failure "$name: exit $rc; last lines of $name.log:"
    tail -5 "$R/$name.log" | sed 's/^/    /' >>"$R/failures.txt"
    status=1
  fi
  summary running
  return 0
}

# ---- 1. binaries -------------------------------------------------------------------------
BIN_FROM="none"
declare -A BIN=()
BUNDLE=${MK_GPU_BUNDLE:-$ROOT/gpu_bundle.tar.xz}
if [ -d "$BUNDLE" ] || [ -f "$BUNDLE" ]; then
  B="$BUNDLE" # an unpacked bundle (meshkern-gpu/: gpu_bundle.sh --stage), or the archive
  [ -f "$BUNDLE" ] && { log "unpack the bundle $BUNDLE"; B="$WORK/meshkern-gpu"; tar -C "$WORK" -xJf "$BUNDLE"; }
  if [ -f "$B/MANIFEST.txt" ]; then
    BIN_FROM="bundle $(basename "$BUNDLE") ($(sed -n 2p "$B/MANIFEST.txt"))"
    cp "$B/MANIFEST.txt" "$R/bundle_manifest.txt"
    for f in "$B"/bin/*; do BIN[$(basename "$f")]=$f; done
    export MESHKERN_SOURCE_DIR="$B/share/meshkern"
  else
    failure "bundle $BUNDLE does not unpack"
  fi
fi

# CUDA's libraries come from the image: the toolkit's folders and PyTorch's nvidia-* wheels.
cuda_dirs=()
# (Only folders of CUDA's: LD_LIBRARY_PATH is searched before the bundle's RUNPATH.)
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
  [ -d "$d" ] && cuda_dirs+=("$d")
done
if command -v python3 >/dev/null; then
  while IFS= read -r d; do [ -d "$d" ] && cuda_dirs+=("$d"); done < <(python3 - 2>/dev/null <<'EOF'
import glob, os, site
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib"))):
        print(d)
EOF
)
fi
CUDA_LIB_PATH=$(IFS=:; echo "${cuda_dirs[*]}")
export LD_LIBRARY_PATH="$CUDA_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ ${#BIN[@]} -eq 0 ] && command -v nvcc >/dev/null && command -v cmake >/dev/null; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  log "no bundle: CMake build (Release, sm_$ARCHS)"
  if cmake -S "$ROOT" -B "$BUILD/cmake" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DMESHKERN_CUDA=ON \
       -DMK_KERNEL_CUDA_ARCHS="$ARCHS" >"$R/configure.log" 2>&1 &&
     cmake --build "$BUILD/cmake" -j "$JOBS" --target test_ops_device test_cuda_backend_device test_sched_cuda_device \
       kernel_bench pipeline_bench meshkern_cli ceilings e2e_bench seam_bench >"$R/build.log" 2>&1; then
    BIN_FROM="CMake build $BUILD/cmake"
    for rel in tests/ops/test_ops_device tests/backend/test_cuda_backend_device tests/backend/test_sched_cuda_device \
               bench/kernel_bench bench/pipeline_bench bench/e2e_bench bench/seam_bench bench/ceilings tools/meshkern; do
      BIN[$(basename "$rel")]="$BUILD/cmake/$rel"
    done
    cp "$BUILD/cmake/ptxas_report.txt" "$R/" 2>/dev/null
  else
    log "CMake build failed (configure.log / build.log): standalone nvcc build"
    SA="$BUILD/standalone"
    if "$ROOT/bench/standalone/build.sh" "$SA" "$ARCHS" >"$R/standalone.log" 2>&1; then
      BIN[kernel_bench]="$SA/kernel_bench"
      [ -x "$SA/test_ops_device" ] && BIN[test_ops_device]="$SA/test_ops_device"
      BIN_FROM="standalone nvcc build (kernels, kernel_bench, the op grid where GoogleTest is)"
    fi
    cp "$SA/ptxas_report.txt" "$SA/build.log" "$R/" 2>/dev/null
  fi
fi
[ ${#BIN[@]} -gt 0 ] || { failure "no binaries: no bundle, and neither build worked"; finish 3; }

# Preflight: each binary's libraries, each found or named missing.
missing=""
for b in "${!BIN[@]}"; do
  ldd "${BIN[$b]}" >"$R/ldd.$b.txt" 2>&1
  m=$(awk '/not found/ {print $1} /error while loading/ {print}' "$R/ldd.$b.txt" | sort -u |
    tr '\n' ' ')
  [ -n "$m" ] && missing+="$b: $m; "
done
for lib in libcudart libcublas libcublasLt libnccl; do
  where=$(cat "$R"/ldd.*.txt | awk -v l="$lib.so" 'index($1, l) == 1 && $3 != "" {print $3; exit}')
  figure "library $lib: ${where:-not needed or not found}"
done
if [ -n "$missing" ]; then
  echo "preflight.libraries FAIL" >>"$R/steps.txt"
  failure "libraries missing (searched the bundle, $CUDA_LIB_PATH): $missing"
  status=1
else
  echo "preflight.libraries PASS" >>"$R/steps.txt"
fi

# ---- 2. the GPU -------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$R/gpu.txt" 2>&1; then
  echo "no NVIDIA GPU visible (nvidia-smi missing or found no device)" >"$R/gpu.txt"
  echo "preflight.gpu FAIL" >>"$R/steps.txt"
  failure "no GPU: the device checks did not run"
  # MK_GPU_CHECK_DRY=1: go on anyway, to exercise every step of this script on a machine
  # without a GPU (the steps then fail or skip as they would with no device).
  [ "${MK_GPU_CHECK_DRY:-0}" = 1 ] || finish 2
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -q >"$R/nvidia-smi-q.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,mig.mode.current,memory.total \
    --format=csv >>"$R/gpu.txt" 2>&1
  echo "preflight.gpu PASS" >>"$R/steps.txt"
fi
has() { [ -n "${BIN[$1]:-}" ] && [ -x "${BIN[$1]}" ]; }

# ---- 3. the device suites (XML) ----------------------------------------------------------
for t in test_ops_device test_cuda_backend_device test_sched_cuda_device; do
  has $t || continue
  step "suite.$t" 200 "${BIN[$t]}" --gtest_output="xml:$R/$t.xml"
  # the totals and every failed case (the full list is in the log and the XML)
  figure "$t: $(grep -E '^\[  PASSED  \] [0-9]+ test' "$R/suite.$t.log" | tail -1), $(grep -c '^\[  SKIPPED \] .*(' "$R/suite.$t.log") skipped"
  grep -E "^\[  FAILED  \] .*\(" "$R/suite.$t.log" | sed "s/^/$t: /" >>"$R/figures.txt"
  grep -q "no CUDA device" "$R/suite.$t.log" && { failure "$t: skipped with \"no CUDA device\" on a GPU machine"; status=1; }
done

# ---- 4. decode on random llamas: SmolLM2's shape (30 layers), an 8B shape (4 layers) ------
SMOL_SHAPE="vocab=49152,hidden=576,layers=30,heads=9,kv_heads=3,ffn=1536,ctx=1024"
B8_SHAPE="vocab=128256,hidden=4096,layers=4,heads=32,kv_heads=8,ffn=14336,ctx=512"
if has meshkern; then
  for spec in "smollm2_f32:$SMOL_SHAPE:f32:" "smollm2_bf16:$SMOL_SHAPE:bf16:--speed" \
              "smollm2_bf16_eager:$SMOL_SHAPE:bf16:--speed --eager-decode" "8b_bf16:$B8_SHAPE:bf16:--speed"; do
    IFS=: read -r name shape dtype extra <<<"$spec"
    # shellcheck disable=SC2086
    step "decode.$name" 90 "${BIN[meshkern]}" run "--random:$shape" --tokens "$(seq -s, 1 64)" --split 1 --max-tokens 128 \
      --backend cuda --dtype "$dtype" $extra
    grep -E "decode [0-9]+ tokens|parity" "$R/decode.$name.log" | sed "s/^ */decode $name: /" >>"$R/figures.txt"
  done
fi

# ---- 5. batched decode (issue 27): aggregate tok/s and per-sequence latency at 1..64
#         sequences in one batch, SmolLM2's shape and the 8B shape, bf16 on the tensor cores -----
if has meshkern && command -v python3 >/dev/null; then
  for spec in "smollm2:$SMOL_SHAPE:1,2,4,8,16,32,64" "8b:$B8_SHAPE:1,8,32,64"; do
    IFS=: read -r name shape levels <<<"$spec"
    step "batch.$name" 120 python3 "$ROOT/bench/batch_bench.py" --meshkern "${BIN[meshkern]}" --model="--random:$shape" \
      --peer none --baseline-n 0 --sequences "$levels" --decode 32 --threads 4 --timeout 60 \
      --meshkern-args "--backend cuda --dtype bf16 --speed" --json "$R/batch.$name.json" --log-dir "$R/batch.$name"
    [ -f "$R/batch.$name.json" ] && python3 - "$R/batch.$name.json" "$name" >>"$R/figures.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for lv in d["levels"]:
    m = lv.get("meshkern")
    if isinstance(m, dict):
        print(f"batch {sys.argv[2]} N={lv['sequences']}: {m['decode_tokens_per_s']} decode tok/s, "
              f"{m['per_sequence_ms_per_token']} ms/token/sequence, {lv.get('meshkern_over_one')}x one sequence")
    else:
        print(f"batch {sys.argv[2]} N={lv['sequences']}: {str(m)[:160]}")
PY
  done
fi

# ---- 6. the decode GEMVs (SmolLM2 and 8B shapes in BF16, Q4_1, Q8_0; every other block format
#         on the 8B's ffn_up, Q6_K/Q5_0 where K-quant files store them) as % of the device copy,
#         and prefill attention on the tensor cores vs a cuBLAS BF16 GEMM ----------------------
if has kernel_bench; then
  mkdir -p "$R/kbench"
  MK_KBENCH_ONLY=copy,gemv,prefill,prefill_tc,gemm step "kernels.gemv_prefill_gemm" 180 "${BIN[kernel_bench]}" "$R/kbench"
  grep -E "^(memcpy_d2d|gemv|attention_prefill|cublas_gemm_bf16|prefill attention|ceiling)" \
    "$R/kernels.gemv_prefill_gemm.log" | sed 's/^/kernel_bench: /' >>"$R/figures.txt"
fi

# ---- 7. compute-sanitizer on the kernels most likely to race or overrun (the grid's small
#         and odd shapes: the model-sized cases would take minutes under instrumentation) ------
SAN_FILTER='*AttentionDecode*past255*:*AttentionDecode*past77*:*AttentionPrefillTc*:*GemvQSet*misaligned*:*Gemv.*odd*'
SAN_FILTER+='-*r2048_*:*r512_past4096*'
if has test_ops_device && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    step "sanitizer.$tool" 120 compute-sanitizer --tool $tool --error-exitcode 9 "${BIN[test_ops_device]}" \
      --gtest_filter="$SAN_FILTER"
    figure "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$R/sanitizer.$tool.log" | tail -1)"
  done
else
  echo "sanitizer SKIP (compute-sanitizer or test_ops_device absent)" >>"$R/steps.txt"
fi

# ---- 8. NCCL: the library, and the NCCL seam between two ranges on one GPU ----------------
if has meshkern; then
  grep -h "libnccl" "$R"/ldd.*.txt | head -1 | sed 's/^[[:space:]]*/nccl library: /' >>"$R/figures.txt"
  # NCCL refuses two ranks on one GPU: the run must end with a named status, never hang.
  step "nccl.two_ranges_one_gpu" 60 bash -c 'out=$("$0" run --random:vocab=300,hidden=64,layers=4,heads=4,kv_heads=2,ffn=96,ctx=64 \
      --tokens 1,2,3 --split 2 --max-tokens 4 --backend cuda --seam nccl --devices 0,0 2>&1); rc=$?
    printf "%s\nexit %d\n" "$out" $rc
    [ $rc -eq 0 ] || printf "%s" "$out" | grep -q "MK_ERR_"' "${BIN[meshkern]}"
  figure "nccl two ranges on one GPU: $(grep -E 'MK_ERR|parity|exit' "$R/nccl.two_ranges_one_gpu.log" | head -2 | tr '\n' ' ')"
fi

# ---- 9. two ranges on one device (2 streams, 2 host threads, a device-to-device seam) against
#         the whole model: a random 0.5B llama, 8 sequences --------------------------------------
if has pipeline_bench; then
  step "pipeline.random_llama" 90 "${BIN[pipeline_bench]}" --random-llama cuda 8 64 2 0,0 f32
  grep -iE "tokens/s|ratio|bubble" "$R/pipeline.random_llama.log" | head -8 | sed 's/^/pipeline: /' >>"$R/figures.txt"
fi

# ---- 10. the harness on the device: its ceilings (the device copy every kernel is judged by) --
if has ceilings; then
  BDIR=$(dirname "${BIN[ceilings]}")
  step "harness" 60 "$ROOT/bench/run.sh" --quick --bin-dir "$BDIR" --out "$R/bench" --no-install --no-plots \
    --suite ceilings
  [ -f "$R/bench/table.txt" ] && sed 's/^/harness: /' "$R/bench/table.txt" >>"$R/figures.txt"
fi

# ---- 11. per-kernel times of one decode run (ncu), when the profiler works here ----------
if has meshkern && command -v ncu >/dev/null; then
  step "ncu.decode_kernels" 90 ncu --clock-control none --print-summary per-kernel --launch-skip 200 --launch-count 400 \
    "${BIN[meshkern]}" run "--random:$SMOL_SHAPE" --tokens 1,2,3,4 --max-tokens 16 --backend cuda --dtype bf16 --speed --eager-decode
  # a container without profiling permission: the profiler cannot count, which says nothing of ours
  if grep -q "ERR_NVGPUCTRPERM" "$R/ncu.decode_kernels.log" 2>/dev/null; then
    sed -i 's/^ncu.decode_kernels FAIL .*/ncu.decode_kernels SKIP (no permission for GPU performance counters)/' "$R/steps.txt"
    awk 'BEGIN {skip = 0} /^ncu.decode_kernels: exit/ {skip = 1; next} skip && /^    / {next} {skip = 0; print}' \
      "$R/failures.txt" >"$R/failures.tmp" && mv "$R/failures.tmp" "$R/failures.txt"
    [ -s "$R/failures.txt" ] || status=0 # no other failure (some have no step line)
  fi
fi

finish $status
