#!/usr/bin/env bash
# layer_check_test.sh SOURCE_DIR - the layer check passes on the tree, and turns red on each
# kind of bad include planted in a copy: one pointing up a floor, one across folders of one
# floor, one across sub-folders of a folder, one naming no floor.
set -uo pipefail
ROOT="$(cd "$1" && pwd)"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
python3 "$ROOT/scripts/layer_check.py" "$ROOT" >"$T/clean.log" || { cat "$T/clean.log"; echo "layer_check_test: FAIL: the tree itself is red"; exit 1; }
plant() { # $1 = file (relative to host/), $2 = include, $3 = expected phrase
  rm -rf "$T/tree" && mkdir -p "$T/tree/scripts"
  cp -r "$ROOT/host" "$ROOT/tools" "$ROOT/kernels" "$T/tree/" && cp "$ROOT/scripts/layer_check.py" "$T/tree/scripts/"
  printf '#include "%s"\n' "$2" >>"$T/tree/host/$1"
  if python3 "$T/tree/scripts/layer_check.py" "$T/tree" >"$T/planted.log"; then
    echo "layer_check_test: FAIL: $1 including $2 passed"; exit 1
  fi
  grep -q "host/$1:.*$3" "$T/planted.log" || { cat "$T/planted.log"; echo "layer_check_test: FAIL: no '$3' for $1"; exit 1; }
}
allow() { # $1 = file, $2 = include that points down: still green
  rm -rf "$T/tree" && mkdir -p "$T/tree/scripts"
  cp -r "$ROOT/host" "$ROOT/tools" "$ROOT/kernels" "$T/tree/" && cp "$ROOT/scripts/layer_check.py" "$T/tree/scripts/"
  printf '#include "%s"\n' "$2" >>"$T/tree/host/$1"
  python3 "$T/tree/scripts/layer_check.py" "$T/tree" >"$T/allowed.log" || { cat "$T/allowed.log"; echo "layer_check_test: FAIL: $1 including $2 (down) was refused"; exit 1; }
}
plant core/error.c seam/seam.h "points up: 'seam' is on floor 'seam', above 'core'"
plant model/gguf.c range/range.h "points up"
plant sched/queue.c stage/stage.h "crosses a floor"
plant backend/cuda/backend_cuda.c backend/cpu/cpu_pool.h "crosses sub-folders"
plant text/tokenizer.c nowhere/x.h "names no floor"
allow seam/local.c net/io.h
allow stage/slots.c core/mk_size.h
echo "layer_check_test: OK"
