#!/usr/bin/env bash
# gpu_bundle_test.sh BUILD_DIR SOURCE_DIR - the GPU bundle (scripts/gpu_bundle.sh) runs where
# none of our -dev packages are, as on the device image.
#
# Packs BUILD_DIR's binaries twice (--reuse: the packaging, RUNPATH and library closure are
# the real script's): whole, and with libprotobuf-c left out. Then, in a private mount
# namespace where this machine's own copy of every library the bundle packs is masked by an
# empty file (what the image looks like to the loader), for each bundle:
#   - the loader's view of every binary (LD_TRACE_LOADED_OBJECTS): nothing "not found", and
#     every library that is not glibc, the GCC runtime or CUDA's comes from the bundle's lib/;
#   - the three device suites run whole: every case skips with "no CUDA device", none fails;
#   - kernel_bench says "no CUDA device" (exit 2); the CLI runs a split random model on the
#     cpu backend (OpenBLAS) to whole-vs-split parity and tokenizes with a BPE fixture (PCRE2)
#     found in the bundle's share/.
# The whole bundle must pass all of it; the one without protobuf-c must fail to start.
# Needs root for the mount namespace: skips (exit 77) without it, fails under CI.
set -uo pipefail
BUILD="$(cd "$1" && pwd)"
ROOT="$(cd "$2" && pwd)"
T="$(mktemp -d)"
[ -n "${MK_KEEP:-}" ] || trap 'rm -rf "$T"' EXIT
fail() { printf 'gpu_bundle_test: FAIL: %s\n' "$*"; exit 1; }

if [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
  if [ "${CI:-}" = true ] || [ "${MESHKERN_REQUIRE_MODEL:-}" = 1 ]; then
    fail "needs root and a mount namespace (unshare -m) to hide the system libraries"
  fi
  echo "gpu_bundle_test: SKIPPED: needs root and unshare -m"
  exit 77
fi

"$ROOT/scripts/gpu_bundle.sh" --reuse "$BUILD" --stage "$T/good" >/dev/null 2>"$T/good.log" ||
  { cat "$T/good.log"; fail "packing the bundle failed"; }
"$ROOT/scripts/gpu_bundle.sh" --reuse "$BUILD" --stage "$T/bad" --omit-lib libprotobuf-c >/dev/null 2>"$T/bad.log" ||
  { cat "$T/bad.log"; fail "packing the bundle without protobuf-c failed"; }
grep -q "LEFT OUT ON PURPOSE.*libprotobuf-c" "$T/bad/meshkern-gpu/MANIFEST.txt" || fail "protobuf-c was not left out"

# The system copies of what the bundle packs (real files behind the sonames).
masks=()
for f in "$T/good/meshkern-gpu/lib/"*; do
  name=$(basename "$f")
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib /lib /usr/local/lib; do
    [ -e "$d/$name" ] && masks+=("$(readlink -f "$d/$name")")
  done
done
[ ${#masks[@]} -gt 0 ] || fail "no system library to mask: the check would prove nothing"
# mount itself loads libpcre2-8 (through libselinux): that mask goes last.
printf '%s\n' "${masks[@]}" | sort -u | awk '/libpcre2/ {last = last $0 "\n"; next} {print} END {printf "%s", last}' \
  >"$T/masks.txt"
: >"$T/empty"

# Runs inside the namespace after the masks; writes logs and exit codes only (grep and
# friends may need a masked library, so nothing is checked in there).
cat >"$T/inside.sh" <<'EOF'
B=$1; OUTD=$2 # made before the masks (mkdir loads libselinux, which loads libpcre2-8)
for f in "$B"/bin/*; do
  LD_TRACE_LOADED_OBJECTS=1 "$f" >"$OUTD/ldd.$(basename "$f")" 2>&1
done
for t in test_ops_device test_cuda_backend_device test_sched_cuda_device; do
  "$B/bin/$t" >"$OUTD/$t.log" 2>&1; echo $? >"$OUTD/$t.rc"
done
"$B/bin/kernel_bench" "$OUTD/kb" >"$OUTD/kernel_bench.log" 2>&1; echo $? >"$OUTD/kernel_bench.rc"
"$B/bin/meshkern" run --random:vocab=301,hidden=64,layers=3,heads=4,kv_heads=2,ffn=96,ctx=64 --tokens 5,17,2,9 \
  --split 1 --max-tokens 6 --backend cpu >"$OUTD/cli_run.log" 2>&1; echo $? >"$OUTD/cli_run.rc"
"$B/bin/meshkern" tokenize "$B/share/meshkern/tests/fixtures/tokenizer/llama3_tiny.gguf" "Hello, world 123" --ids \
  >"$OUTD/cli_tok.log" 2>&1; echo $? >"$OUTD/cli_tok.rc"
EOF

run_isolated() { # $1 = staged bundle, $2 = output folder
  mkdir -p "$2"
  unshare -m --propagation private bash -c '
    while read -r m; do mount --bind "$0/empty" "$m" || exit 90; done <"$0/masks.txt"
    exec bash "$0/inside.sh" "$1" "$2"' "$T" "$1" "$2"
}

# ---- the whole bundle ----------------------------------------------------------------
G="$T/good/meshkern-gpu"
run_isolated "$G" "$T/out.good" || fail "could not mask the system libraries (rc $?)"
for f in "$T/out.good"/ldd.*; do
  b=${f##*/ldd.}
  grep -Eq "not found|error while loading" "$f" && fail "$b: a library is missing with the system copies hidden: $(cat "$f")"
  while read -r name _ path _; do
    [[ "$name" =~ ^(linux-vdso|/lib|/lib64|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libresolv\.|libgcc_s\.|libstdc\+\+\.|libcuda|libcublas|libnccl) ]] && continue
    [[ "$path" == "$G/bin/../lib/"* || "$path" == "$G/lib/"* ]] || fail "$b: $name loads from $path, not the bundle"
  done < <(awk '$2 == "=>" {print $1, $2, $3}' "$f")
done
for t in test_ops_device test_cuda_backend_device test_sched_cuda_device; do
  rc=$(cat "$T/out.good/$t.rc")
  [ "$rc" -eq 0 ] || { tail -20 "$T/out.good/$t.log"; fail "$t exited $rc"; }
  grep -q "no CUDA device" "$T/out.good/$t.log" || fail "$t: the device cases did not skip with \"no CUDA device\""
  grep -q "^\[  FAILED  \]" "$T/out.good/$t.log" && fail "$t: a case failed"
  skipped=$(grep -c "^\[  SKIPPED \] .*(" "$T/out.good/$t.log")
  [ "$skipped" -gt 0 ] || fail "$t: no case ran"
  echo "gpu_bundle_test: $t: $skipped cases skip with \"no CUDA device\""
done
[ "$(cat "$T/out.good/kernel_bench.rc")" -eq 2 ] && grep -q "no CUDA device" "$T/out.good/kernel_bench.log" ||
  fail "kernel_bench: expected \"no CUDA device\" and exit 2: $(cat "$T/out.good/kernel_bench.log")"
[ "$(cat "$T/out.good/cli_run.rc")" -eq 0 ] || { cat "$T/out.good/cli_run.log"; fail "meshkern run on the cpu backend"; }
grep -qi "parity" "$T/out.good/cli_run.log" || { cat "$T/out.good/cli_run.log"; fail "meshkern run printed no parity line"; }
[ "$(cat "$T/out.good/cli_tok.rc")" -eq 0 ] || { cat "$T/out.good/cli_tok.log"; fail "meshkern tokenize with the bundle's fixture"; }
echo "gpu_bundle_test: the whole bundle runs with $(wc -l <"$T/masks.txt") system libraries hidden"

# ---- bench/gpu_check.sh on the staged bundle, dry (no GPU here): every step is tried and
#      listed, the results come back in OUT (the summary, the packed results), the exit says
#      it failed; a TERM mid-run still leaves the summary of what was done ------------------
(cd "$ROOT" && MK_GPU_CHECK_DRY=1 MK_GPU_BUNDLE="$G" OUT="$T/gc" MK_GPU_BUDGET_S=120 \
  bash bench/gpu_check.sh >"$T/gc.log" 2>&1); rc=$?
[ "$rc" -eq 1 ] || { tail -30 "$T/gc.log"; fail "gpu_check dry run: exit $rc, expected 1 (the device checks fail without a GPU)"; }
for want in "preflight.libraries PASS" "preflight.gpu FAIL" "suite.test_ops_device" "decode.smollm2_bf16" "decode.8b_bf16" \
            "batch.smollm2" "batch.8b" "kernels.gemv_prefill_gemm" "nccl.two_ranges_one_gpu" "pipeline.random_llama" "harness PASS"; do
  grep -q "^$want" "$T/gc/summary.txt" || { cat "$T/gc/summary.txt"; fail "gpu_check summary: no step line '$want'"; }
done
grep -q "skipped with \"no CUDA device\" on a GPU machine" "$T/gc/summary.txt" || fail "gpu_check: the device suites' skips were not named"
tar -tzf "$T/gc/gpu_check.tgz" >"$T/gc.list" && grep -q "^results/steps.txt" "$T/gc.list" || fail "gpu_check: the results were not packed"
[ ! -d "$T/gc/results" ] || fail "gpu_check: the results folder stayed beside the archive"
tail -1 "$T/gc.log" | grep -q "all results: $T/gc/gpu_check.tgz" || fail "gpu_check: the summary is not printed last"
(cd "$ROOT" && MK_GPU_CHECK_DRY=1 MK_GPU_BUNDLE="$G" OUT="$T/gc2" exec bash bench/gpu_check.sh >"$T/gc2.log" 2>&1) &
pid=$!
for _ in $(seq 100); do grep -q "^decode" "$T/gc2/results/steps.txt" 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
[ "$rc" -eq 124 ] || fail "gpu_check stopped by TERM: exit $rc, expected 124"
grep -q "exit 124" "$T/gc2/summary.txt" && grep -q "stopped by a signal" "$T/gc2/summary.txt" &&
  grep -q "^suite.test_ops_device" "$T/gc2/summary.txt" || { cat "$T/gc2/summary.txt"; fail "gpu_check stopped by TERM: no summary of what was done"; }
echo "gpu_bundle_test: gpu_check.sh tries every step, brings its results back, and survives a TERM"

# ---- the bundle without protobuf-c: must not start -------------------------------------
run_isolated "$T/bad/meshkern-gpu" "$T/out.bad" || fail "could not mask the system libraries (bad bundle)"
# (the loader stops at the masked system copy, "file too short", or finds none, "not found")
grep -Eq "libprotobuf-c.so.1( => not found|: file too short)" "$T/out.bad/ldd.meshkern" ||
  fail "without protobuf-c in the bundle, the loader still found one: the masks hide nothing"
[ "$(cat "$T/out.bad/cli_run.rc")" -ne 0 ] || fail "meshkern ran without protobuf-c"
grep -q "error while loading shared libraries" "$T/out.bad/cli_run.log" || fail "meshkern: no loader error"
echo "gpu_bundle_test: the bundle without protobuf-c is refused by the loader, as it must be"
echo "gpu_bundle_test: OK"
