#!/usr/bin/env bash
# Test of the tests (the skip rule in tests/mk_test_util.h): a SmolLM2 suite pointed at
#   a corrupt copy of the model                   must FAIL (never a green skip),
#   a missing model with MESHKERN_REQUIRE_MODEL=1 must FAIL,
#   a missing model on a developer's machine      must SKIP.
# usage: model_rule_check.sh <test binary> <gtest filter> <real model path (may be absent)>
set -u
bin=$1 filter=$2 model=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
corrupt=$tmp/corrupt.gguf
# A truncated copy: a real GGUF header whose metadata and tensor data are cut off.
if [ -f "$model" ]; then head -c 1048576 "$model" >"$corrupt"; else printf 'GGUF\003\000\000\000truncated' >"$corrupt"; fi

bad=0
# expect <name> <want rc: zero|nonzero> <output regex> env...
expect() {
    local name=$1 want=$2 regex=$3
    shift 3
    local out rc
    out=$(env -u CI "$@" "$bin" --gtest_filter="$filter" 2>&1)
    rc=$?
    local ok=1
    if [ "$want" = zero ] && [ $rc -ne 0 ]; then ok=0; fi
    if [ "$want" = nonzero ] && [ $rc -eq 0 ]; then ok=0; fi
    if ! grep -Eq "$regex" <<<"$out"; then ok=0; fi
    if [ $ok = 1 ]; then
        echo "ok: $name (exit $rc)"
    else
        echo "WRONG: $name: exit $rc, want $want exit and /$regex/ in:"
        tail -n 30 <<<"$out"
        bad=1
    fi
}

expect "corrupt model fails" nonzero "is present but does not open" MESHKERN_MODEL="$corrupt" MESHKERN_REQUIRE_MODEL=0
expect "corrupt model fails under CI too" nonzero "is present but does not open" MESHKERN_MODEL="$corrupt" CI=true
expect "missing model fails when required" nonzero "is missing and required" MESHKERN_MODEL="$tmp/absent.gguf" MESHKERN_REQUIRE_MODEL=1
expect "missing model fails under CI=true" nonzero "is missing and required" MESHKERN_MODEL="$tmp/absent.gguf" CI=true
expect "missing model skips on a developer machine" zero "SKIPPED" MESHKERN_MODEL="$tmp/absent.gguf" MESHKERN_REQUIRE_MODEL=0
exit $bad
