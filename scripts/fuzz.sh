#!/usr/bin/env bash
# Fuzz the parsers of untrusted input (wire bundles, seam frames, GGUF files, what a stranger
# sends a stage: rendezvous hellos and control messages), the tokenizer's encoder (arbitrary
# bytes in) and meshkern serve's request path (a JSON body -> a checked request; where
# libcjson is installed) with libFuzzer + ASan + UBSan, SECONDS seconds each (default 60);
# FUZZ_TARGETS="control frame" runs only those (names: bundle frame gguf tokenizer control
# serve_request). Seeds: a packed bundle, real frame bodies, the GGUF test fixtures, and
# for the encoder the golden strings. MK_FUZZ_SMOLLM2=models/SmolLM2-135M-Instruct.Q4_1.gguf
# adds SmolLM2's tokenizer. Needs clang and its runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${1:-60}"
BUILD=build-fuzz
CC=clang cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_CUDA=OFF -DMESHKERN_TESTS=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
ninja -C "$BUILD" meshkern_core >/dev/null
LIBS=("$BUILD/host/libmeshkern_core.a" "$BUILD/proto/libmeshkern_proto.a" -lprotobuf-c -lpcre2-8 -lopenblas -lssl -lcrypto -lm -lpthread)
for target in ${FUZZ_TARGETS:-bundle frame gguf tokenizer control}; do
  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Icommon -Ihost -I"$BUILD/proto" \
    "tests/fuzz/fuzz_$target.c" "${LIBS[@]}" -o "$BUILD/fuzz_$target"
  corpus="$BUILD/corpus_$target"
  mkdir -p "$corpus"
  if [ "$target" = gguf ]; then cp tests/fixtures/dequant/*.gguf tests/fixtures/tokenizer/*.gguf "$corpus/" 2>/dev/null || true; fi
  if [ "$target" = tokenizer ] && [ -f tests/fixtures/tokenizer/goldens.tsv ]; then
    # seeds: each golden string behind a selector byte (tokenizer and flags)
    python3 - "$corpus" <<'PY'
import sys, os
out = sys.argv[1]
for i, line in enumerate(open("tests/fixtures/tokenizer/goldens.tsv")):
    cols = line.rstrip("\n").split("\t")
    if len(cols) == 5 and i % 4 == 0:
        open(os.path.join(out, f"g{i}"), "wb").write(bytes([i % 64]) + bytes.fromhex(cols[3]))
PY
  fi
  # Seeds for the frame decoder: real frame bodies of a few shapes (meshkern run writes none,
  # so a small program packs them through the public API).
  if [ "$target" = frame ] && [ -z "$(ls -A "$corpus")" ]; then
    clang -Iinclude tests/fuzz/seed_frame.c "${LIBS[@]}" -fsanitize=address,undefined -o "$BUILD/seed_frame"
    "$BUILD/seed_frame" "$corpus"
  fi
  # Seeds for the control target: the hellos of a world-3 run (right, another digest, a rank
  # out of range, half of one), an abort, a ping and garbage, behind the two selector bytes.
  if [ "$target" = control ] && [ -z "$(ls -A "$corpus")" ]; then
    python3 - "$corpus" <<'PY'
import os, struct, sys
out = sys.argv[1]
d = "2ac2c9cfd401cb11e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
def msg(t, body): return struct.pack("<III", 0x54434B4D, t, len(body)) + body
seeds = {"hello": msg(1, f"1 3 {d} 127.0.0.1:4000".encode()),
         "hello_other": msg(1, b"2 3 " + b"0" * 64 + b" 127.0.0.1:4000"),
         "hello_rank7": msg(1, f"7 3 {d} 127.0.0.1:1".encode()),
         "half": msg(1, b"1 3 ")[:20],
         "abort": msg(6, b"52 rank 2 refused\n0 1 2 ") + msg(7, b""),
         "garbage": b"GET / HTTP/1.0\r\n\r\n"}
for name, body in seeds.items():
    open(os.path.join(out, name), "wb").write(bytes([1, 0]) + body)
PY
  fi
  echo "== fuzz_$target for ${SECONDS_EACH}s"
  "$BUILD/fuzz_$target" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 "$corpus" 2>&1 | tail -3
done
# meshkern serve's request path (JSON body -> checked request), where libcjson is installed
# (target name serve_request for FUZZ_TARGETS).
if [[ -z "${FUZZ_TARGETS:-}" || " $FUZZ_TARGETS " == *" serve_request "* ]] && pkg-config --exists libcjson; then
  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Icommon -Ihost -Itools \
    tests/fuzz/fuzz_serve_request.c tools/serve_req.c $(pkg-config --cflags --libs libcjson) "${LIBS[@]}" \
    -o "$BUILD/fuzz_serve_request"
  corpus="$BUILD/corpus_serve_request"
  mkdir -p "$corpus"
  printf '\000{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stop":["a","bc"]}' >"$corpus/chat"
  printf '\001{"prompt":"The capital of","stream":true,"stream_options":{"include_usage":true}}' >"$corpus/completion"
  printf '\000{"messages":[{"role":"system","content":[{"type":"text","text":"x"}]},{"role":"user","content":"y"}],"temperature":0,"n":1,"seed":3}' >"$corpus/parts"
  echo "== fuzz_serve_request for ${SECONDS_EACH}s"
  "$BUILD/fuzz_serve_request" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 "$corpus" 2>&1 | tail -3
fi
