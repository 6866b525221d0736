#!/usr/bin/env bash
# build.sh - the GPU check's last resort: the CUDA kernels, the CPU reference ops and
# kernel_bench built with nvcc and gcc alone, for a GPU machine that has neither our -dev
# packages nor a bundle (bench/gpu_check.sh calls it when CMake cannot configure). Also the
# op grid, where GoogleTest is installed. The CI test (tests/gpu_standalone_test.sh) runs it.
#
#   bench/standalone/build.sh OUTDIR [ARCH]    ARCH: e.g. 90 (default); env JOBS (nvcc processes
#                                              at once; default: every core), MK_STANDALONE_GENCODE
#                                              overrides the -gencode argument, MK_STANDALONE_OPS=0
#                                              skips the op grid
# Writes OUTDIR/kernel_bench (and OUTDIR/test_ops_device), OUTDIR/ptxas_report.txt and
# OUTDIR/build.log. Exit 0 when kernel_bench links.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$1
ARCH=${2:-90}
GENCODE=${MK_STANDALONE_GENCODE:-arch=compute_$ARCH,code=sm_$ARCH}
mkdir -p "$OUT"
LOG="$OUT/build.log"
: >"$LOG"
INC=(-I"$ROOT/include" -I"$ROOT/common" -I"$ROOT/host" -I"$ROOT/kernels" -I"$ROOT/kernels/nvcc" -I"$ROOT/tests")
# host objects kernel_bench and the op grid need: errors, half conversions, the contract's dtype
# table, the CPU reference ops, GGUF block dequantization; then their case table
# (against a stand-in cblas.h: no OpenBLAS here)
objs=()
for src in core/error.c core/half.c protocol/contract.c backend/cpu/cpu_ops.c model/gguf_dequant.c; do
  o="$OUT/$(basename "${src%.c}").o"
  gcc -O2 -std=c11 -c "$ROOT/host/$src" -I"$ROOT/bench/standalone" "${INC[@]}" -o "$o" >>"$LOG" 2>&1 ||
    { echo "standalone: $src failed (see $LOG)" >&2; exit 1; }
  objs+=("$o")
done
# the op case table both kernel_bench and the op grid iterate (tests/ops/op_cases.cpp)
nvcc -O2 -std=c++17 "${INC[@]}" -c "$ROOT/tests/ops/op_cases.cpp" -o "$OUT/op_cases.o" >>"$LOG" 2>&1 ||
  { echo "standalone: tests/ops/op_cases.cpp failed (see $LOG)" >&2; exit 1; }
objs+=("$OUT/op_cases.o")
# at most JOBS nvcc processes at once (the CI test runs one: other tests share the cores)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
fail=0
for cu in "$ROOT"/kernels/*.cu; do
  o="$OUT/$(basename "$cu" .cu).o"
  objs+=("$o")
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || fail=1; done
  nvcc -O3 -std=c++17 -gencode "$GENCODE" -Xptxas -v "${INC[@]}" -c "$cu" -o "$o" >"$o.log" 2>&1 &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || fail=1; done
cat "$OUT"/*.o.log >"$OUT/ptxas_report.txt" 2>/dev/null
[ $fail = 0 ] || { grep -i error "$OUT/ptxas_report.txt" | head >&2; echo "standalone: nvcc failed" >&2; exit 1; }
nvcc -O2 -std=c++17 "${INC[@]}" "$ROOT/bench/kernel_bench.cpp" "${objs[@]}" -lcublas -o "$OUT/kernel_bench" >>"$LOG" 2>&1 ||
  { tail -20 "$LOG" >&2; echo "standalone: kernel_bench did not link" >&2; exit 1; }
echo "standalone: $OUT/kernel_bench"
if [ "${MK_STANDALONE_OPS:-1}" = 1 ] && { [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; }; then
  nvcc -O2 -std=c++17 "${INC[@]}" "$ROOT/tests/ops/test_ops.cpp" "${objs[@]}" -lgtest -lgtest_main -lpthread \
    -o "$OUT/test_ops_device" >>"$LOG" 2>&1 && echo "standalone: $OUT/test_ops_device" ||
    echo "standalone: the op grid did not build (see $LOG); kernel_bench still validates every kernel" >&2
fi
exit 0
