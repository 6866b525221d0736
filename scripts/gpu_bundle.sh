#!/usr/bin/env bash
# gpu_bundle.sh - build here, pack, and carry to the GPU machine everything bench/gpu_check.sh
# runs there. The device image has nvcc, CMake, ninja, the CUDA runtime and PyTorch but none
# of our Debian -dev packages and no network, so the check cannot build there: it runs this
# bundle instead.
#
#   scripts/gpu_bundle.sh                 Release build for sm_90 (+ PTX of the newest arch
#                                         nvcc knows) in build-bundle/, packed into
#                                         gpu_bundle.tar.xz (git-ignored; make it fresh
#                                         before each device run)
#   scripts/gpu_bundle.sh --reuse BUILD   pack the binaries of an existing build instead
#                                         (the CI test; not relocatable: may name this tree)
#   --stage DIR      leave the unpacked bundle in DIR/meshkern-gpu, no archive
#   --out FILE       the archive's path
#   --omit-lib PAT   leave out the libraries whose name matches PAT (the CI test's red case)
#
# Layout: meshkern-gpu/{bin,lib,share/meshkern/tests/fixtures,MANIFEST.txt}. Binaries find
# lib/ through RUNPATH $ORIGIN/../lib (libraries: $ORIGIN). lib/ holds every shared library
# the binaries need apart from glibc, the GCC runtime and CUDA's (libcudart, cuBLAS, NCCL,
# libcuda): those come from the image, found by gpu_check.sh at run time. GoogleTest is
# linked statically (Debian ships only the static library). Tests find their fixtures in
# share/meshkern (tests/mk_test_util.h: mk_test_source_dir).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$PATH:/usr/local/cuda/bin"
OUT_FILE="$ROOT/gpu_bundle.tar.xz"
BUILD="$ROOT/build-bundle"
REUSE="" STAGE_DIR="" OMIT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reuse) REUSE="$2"; shift 2 ;;
    --stage) STAGE_DIR="$2"; shift 2 ;;
    --out) OUT_FILE="$2"; shift 2 ;;
    --omit-lib) OMIT="$2"; shift 2 ;;
    *) echo "gpu_bundle: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
log() { printf '[gpu_bundle] %s\n' "$*" >&2; }
die() { printf '[gpu_bundle] FAIL: %s\n' "$*" >&2; exit 1; }

# What gpu_check.sh runs (build-relative path): the device suites, the benches, the CLI.
REQUIRED=(tests/ops/test_ops_device tests/backend/test_cuda_backend_device tests/backend/test_sched_cuda_device
          bench/kernel_bench bench/e2e_bench bench/pipeline_bench bench/seam_bench bench/ceilings tools/meshkern)
OPTIONAL=(bench/nccl_seam_bench)
TARGETS=(test_ops_device test_cuda_backend_device test_sched_cuda_device kernel_bench e2e_bench pipeline_bench
         seam_bench ceilings meshkern_cli)

# Libraries the image provides (or that must match its driver): never packed.
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libutil|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-.*)\.so'

for tool in patchelf ldd; do command -v $tool >/dev/null || die "$tool not found (scripts/deps.sh installs it)"; done

if [ -z "$REUSE" ]; then
  command -v nvcc >/dev/null || die "nvcc not found: the bundle carries the CUDA kernels"
  "$ROOT/scripts/deps.sh"
  log "configure $BUILD (Release, sm_90 + PTX, relocatable, no MPI)"
  mkdir -p "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHKERN_CUDA=ON -DMESHKERN_TESTS=ON \
    -DMESHKERN_MPI=OFF -DMESHKERN_RELOCATABLE=ON -DMK_KERNEL_CUDA_ARCHS=90 >"$BUILD/configure.log" 2>&1 ||
    { tail -20 "$BUILD/configure.log"; die "configure failed"; }
  log "build ${TARGETS[*]} nccl_seam_bench"
  ninja -C "$BUILD" "${TARGETS[@]}" >&2 || die "build failed"
  ninja -C "$BUILD" nccl_seam_bench >/dev/null 2>&1 || log "no nccl_seam_bench target (NCCL not linked): left out"
  SRC_BUILD="$BUILD"
else
  SRC_BUILD="$(cd "$REUSE" && pwd)"
fi

if [ -n "$STAGE_DIR" ]; then
  mkdir -p "$STAGE_DIR"
  TOP="$(cd "$STAGE_DIR" && pwd)"
else
  TOP="$(mktemp -d)"
  trap 'rm -rf "$TOP"' EXIT
fi
B="$TOP/meshkern-gpu"
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib" "$B/share/meshkern/tests"

bins=()
for rel in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do
  f="$SRC_BUILD/$rel"
  if [ ! -x "$f" ]; then
    for r in "${REQUIRED[@]}"; do [ "$r" = "$rel" ] && die "$f missing (build it first)"; done
    continue
  fi
  cp "$f" "$B/bin/"
  bins+=("$B/bin/$(basename "$rel")")
done

# The closure of the shared libraries they need, as this machine's loader resolves them.
declare -A packed=()
omitted=()
while read -r name path; do
  [ -n "$path" ] && [ -f "$path" ] || continue
  [[ "$name" =~ $SYSTEM_LIBS ]] && continue
  [ -n "${packed[$name]:-}" ] && continue
  if [ -n "$OMIT" ] && [[ "$name" == *$OMIT* ]]; then
    omitted+=("$name")
    packed[$name]=omitted
    continue
  fi
  cp -L "$path" "$B/lib/$name"
  chmod u+w "$B/lib/$name"
  packed[$name]="$path"
done < <(for f in "${bins[@]}"; do ldd "$f" | awk '$2 == "=>" {print $1, $3}'; done | sort -u)

for f in "${bins[@]}"; do
  strip --strip-debug "$f"
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$B"/lib/*; do
  strip --strip-debug "$f" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN' "$f"
done
cp -r "$ROOT/tests/fixtures" "$B/share/meshkern/tests/"

# A relocatable build names no folder of this machine: a carried binary must not depend on it.
leaks=""
if [ -z "$REUSE" ]; then
  leaks=$(grep -l -F "$ROOT" "$B"/bin/* "$B"/lib/* 2>/dev/null || true)
  [ -z "$leaks" ] || die "absolute source path $ROOT baked into: $leaks"
fi

{
  echo "meshkern GPU bundle"
  echo "commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), from ${REUSE:+an existing build }$SRC_BUILD"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo absent)"
  grep -E "^MK_KERNEL_(CUDA|PTX)_ARCH" "$SRC_BUILD/CMakeCache.txt" 2>/dev/null || true
  echo "binaries:"
  for f in "${bins[@]}"; do printf '  %s\n' "$(basename "$f")"; done
  echo "packed libraries (name <- where this machine had it):"
  for n in $(printf '%s\n' "${!packed[@]}" | sort); do printf '  %s <- %s\n' "$n" "${packed[$n]}"; done
  echo "from the image at run time: libcudart.so, libcublas.so, libcublasLt.so, libnccl.so (gpu_check.sh finds them)"
  [ ${#omitted[@]} -eq 0 ] || echo "LEFT OUT ON PURPOSE (--omit-lib $OMIT): ${omitted[*]}"
} >"$B/MANIFEST.txt"

if [ -n "$STAGE_DIR" ]; then
  log "staged in $B ($(du -sh "$B" | cut -f1))"
  exit 0
fi
tar -C "$TOP" -cf - meshkern-gpu | xz -T0 -6 >"$OUT_FILE.tmp"
mv "$OUT_FILE.tmp" "$OUT_FILE"
log "$OUT_FILE: $(du -h "$OUT_FILE" | cut -f1) ($(du -sh "$B" | cut -f1) unpacked, ${#bins[@]} binaries, ${#packed[@]} libraries)"
echo "$OUT_FILE"
