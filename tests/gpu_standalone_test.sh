#!/usr/bin/env bash
# gpu_standalone_test.sh SOURCE_DIR - the GPU check's last resort builds and links: the kernels
# (PTX only here, to keep CI short: the build path, not the machine code, is under test), the
# host objects kernel_bench needs and kernel_bench itself, with no CMake, no OpenBLAS and no
# protobuf-c (bench/standalone/build.sh); the binary starts and says "no CUDA device".
set -uo pipefail
ROOT="$(cd "$1" && pwd)"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export PATH="$PATH:/usr/local/cuda/bin"
# one nvcc at a time: ctest runs other tests beside this one, some of them timing-sensitive
JOBS=1 MK_STANDALONE_OPS=0 MK_STANDALONE_GENCODE=arch=compute_90,code=compute_90 "$ROOT/bench/standalone/build.sh" "$T" ||
  { echo "gpu_standalone_test: FAIL: the standalone build failed"; exit 1; }
for lib in protobuf-c openblas pcre2 ssl; do
  ldd "$T/kernel_bench" | grep -q "$lib" && { echo "gpu_standalone_test: FAIL: kernel_bench links $lib"; exit 1; }
done
"$T/kernel_bench" "$T" >"$T/run.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "no CUDA device" "$T/run.log" ||
  { cat "$T/run.log"; echo "gpu_standalone_test: FAIL: expected \"no CUDA device\" and exit 2, got $rc"; exit 1; }
echo "gpu_standalone_test: OK"
