#!/usr/bin/env bash
# Line and branch coverage of the host code by chosen test binaries (gcov, no other tool):
# a CPU-only --coverage build in build-cov/ (-O0, MESHKERN_CUDA=OFF), the counters reset,
# the tests run, then per source file: lines executed and branches taken at least once.
# A guide to what the suites never exercise, not a target; not part of CI.
#
#   scripts/coverage.sh [TEST[:GTEST_FILTER] ...]
#
# TEST is a test target (test_seams, test_nccl_seam_sim, test_stage_units, test_stage,
# test_generate, ...); without arguments the seam and stage suites run (the NCCL transport's
# fault cases of test_nccl_pipeline_sim among them). Targets this tree
# does not define are skipped (so an older checkout can be measured the same way).
# Environment: BUILD (default build-cov), JOBS (default 2).
#
# Output: the summary table on stdout (and in $BUILD/coverage/summary.txt); per file, the
# annotated source ($BUILD/coverage/<file>.gcov) and every line with a branch never taken
# ($BUILD/coverage/untaken.txt: "file:line: taken/branches  source").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "$ROOT" && mkdir -p "${BUILD:-build-cov}" && cd "${BUILD:-build-cov}" && pwd)"
JOBS="${JOBS:-2}"
OUT="$BUILD/coverage"
export OPENBLAS_NUM_THREADS=1
# The files reported (globs, relative to the source root).
FILES=(host/net/*.c host/protocol/bundle_codec.c host/seam/*.c host/seam/nccl/*.c host/stage/*.c host/pipeline/generate.c host/text/tokenizer*.c host/text/detokenizer.c)

if [ $# -gt 0 ]; then
  SPECS=("$@")
else
  SPECS=(test_seams test_nccl_seam_sim test_stage_units test_stage
         "test_nccl_pipeline_sim:NcclSeamFaults.*:NcclPipeline.RangesOnOneDeviceOrOnTheCpuAreRefusedClearly")
fi

log() { printf '%s\n' "$*" >&2; }

log "== configure $BUILD (--coverage, -O0, cpu only)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESHKERN_CUDA=OFF -DMESHKERN_TESTS=ON \
  -DCMAKE_C_FLAGS="--coverage -O0" -DCMAKE_CXX_FLAGS="--coverage -O0" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage >"$BUILD/configure.log" 2>&1 ||
  { tail -20 "$BUILD/configure.log"; exit 2; }

known=$(ninja -C "$BUILD" -t targets all 2>/dev/null | sed 's/:.*//')
targets=()
runs=()
for spec in "${SPECS[@]}"; do
  t="${spec%%:*}"
  if ! grep -qx "$t" <<<"$known"; then
    log "   (no target $t in this tree: skipped)"
    continue
  fi
  targets+=("$t")
  runs+=("$spec")
done
[ ${#targets[@]} -gt 0 ] || { log "no test target to run"; exit 2; }

log "== build ${targets[*]}"
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" >"$BUILD/build.log" 2>&1 || { tail -30 "$BUILD/build.log"; exit 2; }

find "$BUILD" -name '*.gcda' -delete
: >"$BUILD/tests.log"
failed=0
for spec in "${runs[@]}"; do
  t="${spec%%:*}"
  filter="*"
  [ "$spec" != "$t" ] && filter="${spec#*:}"
  exe=$(find "$BUILD/tests" -type f -name "$t" -perm -u+x | head -1)
  log "== run $t --gtest_filter=$filter"
  if ! (cd "$BUILD" && timeout 1800 "$exe" --gtest_filter="$filter" >>"$BUILD/tests.log" 2>&1); then
    log "   $t had failures (counted anyway; see $BUILD/tests.log)"
    failed=1
  fi
done

# ---- gcov per source file ---------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
untaken="$OUT/untaken.txt"
: >"$untaken"
printf '%-34s %18s %20s\n' "file" "lines" "branches taken" >"$summary"
tl=0 te=0 tb=0 tt=0
cd "$ROOT"
for src in ${FILES[@]}; do
  [ -f "$src" ] || continue
  rel="${src#host/}"
  # The object of the static core (or of the NCCL seam's object library) that has counters.
  gcda=$(find "$BUILD/host" -path "*/meshkern_core.dir/$rel.gcda" -o -path "*/meshkern_nccl_seam.dir/$(basename "$rel").gcda" |
         grep -F "/$(basename "$rel").gcda" | head -1)
  gcno=$(find "$BUILD/host" -path "*/meshkern_core.dir/$rel.gcno" -o -path "*/meshkern_nccl_seam.dir/$(basename "$rel").gcno" |
         head -1)
  if [ -z "$gcno" ]; then
    continue # not built in this configuration (e.g. nccl_absent.c beside the real seam)
  fi
  lines=0 lexec=0 branches=0 taken=0
  if [ -n "$gcda" ]; then
    obj="${gcda%.gcda}"
    # -b branches, -c counts, -r only this source, -t annotated source on stdout.
    (cd "$OUT" && gcov -b -c -r -s "$ROOT" -t -o "$obj.o" "$ROOT/$src" >"$OUT/$(echo "$src" | tr / _).gcov" 2>/dev/null)
    read -r lines lexec branches taken < <(awk '
      /^ *-:/ { next }
      /^ *#####:/ || /^ *=====:/ { l++; next }
      /^ *[0-9]+\*?:/ { l++; e++; next }
      /^branch/ { b++; if ($0 ~ /taken [1-9]/) t++; next }
      END { printf "%d %d %d %d\n", l, e, b, t }' "$OUT/$(echo "$src" | tr / _).gcov")
    awk -v f="$src" '
      /^ *(-|#####|=====|[0-9]+\*?):/ {
        flush(); split($0, a, ":"); ln = a[2] + 0; text = $0; sub(/^[^:]*:[^:]*:/, "", text); nb = 0; nt = 0; next }
      /^branch/ { nb++; if ($0 ~ /taken [1-9]/) nt++; next }
      function flush() { if (nb > nt) printf "%s:%d: %d/%d %s\n", f, ln, nt, nb, text; nb = 0; nt = 0 }
      END { flush() }' "$OUT/$(echo "$src" | tr / _).gcov" >>"$untaken"
  else
    # Never run: every line unexecuted. The line count from gcov on the notes alone.
    (cd "$OUT" && gcov -b -r -s "$ROOT" -t -o "${gcno%.gcno}.o" "$ROOT/$src" >"$OUT/$(echo "$src" | tr / _).gcov" 2>/dev/null)
    read -r lines branches < <(awk '/^ *#####:/ { l++ } /^branch/ { b++ } END { printf "%d %d\n", l, b }' \
      "$OUT/$(echo "$src" | tr / _).gcov")
  fi
  pct() { if [ "$2" -gt 0 ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%5.1f%%", 100 * a / b }'; else printf '    - '; fi; }
  printf '%-34s %6s of %5d %8s of %5d\n' "$src" "$(pct "$lexec" "$lines")" "$lines" "$(pct "$taken" "$branches")" \
    "$branches" >>"$summary"
  tl=$((tl + lines)) te=$((te + lexec)) tb=$((tb + branches)) tt=$((tt + taken))
done
printf '%-34s %6s of %5d %8s of %5d\n' "total" "$(awk -v a=$te -v b=$tl 'BEGIN { printf "%5.1f%%", b ? 100 * a / b : 0 }')" \
  "$tl" "$(awk -v a=$tt -v b=$tb 'BEGIN { printf "%5.1f%%", b ? 100 * a / b : 0 }')" "$tb" >>"$summary"
printf '\ntests: %s\n' "${runs[*]}" >>"$summary"
cat "$summary"
log "(annotated sources and untaken branches: $OUT)"
exit $failed
