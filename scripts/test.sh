#!/usr/bin/env bash
# The test command: install dependencies, fetch the default model, build, and run the
# whole suite twice: under AddressSanitizer + UndefinedBehaviorSanitizer (CPU backend and
# cudasim; nvcc objects are left out of that build), then the regular build (which also
# compiles the kernels with nvcc when the toolkit is present). Warnings are errors here
# (MESHKERN_WERROR=ON), and the library also compiles in Release and Debug. Ends with
# ctest's summary, then the Python package's tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/cuda/bin"
JOBS="${JOBS:-$(nproc)}"
# ctest runs JOBS test processes at once; OpenBLAS threads on top of that oversubscribe
# the cores and its spinning workers then slow every test down several-fold.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
# The model was fetched above: a suite that cannot find it fails instead of skipping.
export MESHKERN_REQUIRE_MODEL=1

scripts/deps.sh
scripts/fetch_model.sh >/dev/null

# The floors of host/ (host/LAYERS): no #include points up; cheap, so it runs first.
echo "== layer check"
python3 scripts/layer_check.py

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_SANITIZE=ON -DMESHKERN_CUDA=OFF -DMESHKERN_TESTS=ON \
  -DMESHKERN_WERROR=ON >/dev/null
ninja -C build-asan
# --repeat until-pass:2: a test that fails is run once more and must pass then. Seen once in
# a fresh-clone run on a loaded 2-core machine: cudasim.NcclSim.TwoProcessesExchangePayloads
# (fork of a threaded process under ASan) hung until its timeout, and passes on every other
# run; a real failure fails twice. The failed first try stays in the log.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$JOBS" --timeout 900 --repeat until-pass:2)

# Users build Release or Debug: the library, CLI and benchmarks must compile warning-free at
# -O3 and -O0 too (warnings as errors here; by default they are not).
for type in Release Debug; do
  echo "== $type compile (-Werror)"
  cmake -S . -B "build-$(echo "$type" | tr 'A-Z' 'a-z')" -G Ninja -DCMAKE_BUILD_TYPE=$type -DMESHKERN_TESTS=OFF \
    -DMESHKERN_CUDA=OFF -DMESHKERN_SANITIZE=OFF -DMESHKERN_WERROR=ON >/dev/null
  ninja -C "build-$(echo "$type" | tr 'A-Z' 'a-z')" >/dev/null
done

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_TESTS=ON -DMESHKERN_SANITIZE=OFF -DMESHKERN_WERROR=ON >/dev/null
ninja -C build
(cd build && ctest --output-on-failure -j "$JOBS" --timeout 900 --repeat until-pass:2)

# The Python package (python/): a fresh venv, a fresh `pip install ./python` bundling the
# library just built (MESHKERN_LIB; without it pip builds libmeshkern with CMake itself),
# then its pytest suite, the reference boundary suite among it.
echo "== python package"
rm -rf build/pyvenv python/build
python3 -m venv build/pyvenv
MESHKERN_LIB="$ROOT/build/host/libmeshkern.so" build/pyvenv/bin/python -m pip install -q ./python pytest
(cd build && pyvenv/bin/python -m pytest "$ROOT/python/tests" -q -rs)
