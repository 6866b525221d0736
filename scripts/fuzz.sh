#!/usr/bin/env bash
# Fuzz the parsers of untrusted input (wire bundles, seam frames, GGUF files) with libFuzzer + ASan +
# UBSan, SECONDS seconds each (default 60). Seeds: a packed bundle and the GGUF test
# fixtures. Needs clang and its runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${1:-60}"
BUILD=build-fuzz
CC=clang cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_CUDA=OFF -DMESHKERN_TESTS=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
ninja -C "$BUILD" meshkern_core >/dev/null
LIBS=("$BUILD/host/libmeshkern_core.a" "$BUILD/proto/libmeshkern_proto.a" -lprotobuf-c -lopenblas -lssl -lcrypto -lm -lpthread)
for target in bundle frame gguf; do
  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Ihost -I"$BUILD/proto" \
    "tests/fuzz/fuzz_$target.c" "${LIBS[@]}" -o "$BUILD/fuzz_$target"
  corpus="$BUILD/corpus_$target"
  mkdir -p "$corpus"
  if [ "$target" = gguf ]; then cp tests/fixtures/dequant/*.gguf "$corpus/" 2>/dev/null || true; fi
  # Seeds for the frame decoder: real frame bodies of a few shapes (meshkern run writes none,
  # so a small program packs them through the public API).
  if [ "$target" = frame ] && [ -z "$(ls -A "$corpus")" ]; then
    clang -Iinclude tests/fuzz/seed_frame.c "${LIBS[@]}" -fsanitize=address,undefined -o "$BUILD/seed_frame"
    "$BUILD/seed_frame" "$corpus"
  fi
  echo "== fuzz_$target for ${SECONDS_EACH}s"
  "$BUILD/fuzz_$target" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 "$corpus" 2>&1 | tail -3
done
