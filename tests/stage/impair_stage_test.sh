#!/usr/bin/env bash
# Stage processes over an impaired network: two network namespaces joined by a user-space
# wire (impair_wire.py: a TUN device in each, every IP packet copied across after a delay,
# some held, or none at all when the link is cut) with tc tbf rate limits on the TUN
# devices. Rank 0 and rank 2 run in namespace A, rank 1 in namespace B, so both seams and
# rank 1's control connection cross the wire (rank 2's results to rank 0 do not).
#
#   impair_stage_test.sh MESHKERN_BIN PROMPTS
#
# Conditions: 0, 10 and 50 ms one way; 10 ms with 1% of the packets held 200 ms; 256 kbit/s
# (tbf) — each must give tokens equal to the whole model's (`meshkern run --prompts`, one
# process) with no timeout at --timeout 5; then the link is cut mid-run at --timeout 1:
# rank 0 must report it within its deadline (1.25 s; limit 3 s), every request must be
# reported, and every process must be gone within 2 deadlines + 3 s of the cut. Prints
# tokens/s per condition and the detection time. Needs root (namespaces, TUN, tc): skips
# (77) without it; under CI=true a root that cannot make namespaces fails.
set -uo pipefail
BIN="$1"
PROMPTS="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d /tmp/mk_impair.XXXXXX)"
NS_A="mk23a$$"
NS_B="mk23b$$"
CTL="$WORK/wire.ctl"
WIRE=""
PIDS=()

skip() { echo "impair_stage_test: SKIP: $*"; exit 77; }
fail() { echo "impair_stage_test: FAIL: $*"; exit 1; }
cleanup() {
  for p in "${PIDS[@]-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  [ -n "$WIRE" ] && kill "$WIRE" 2>/dev/null && wait "$WIRE" 2>/dev/null
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, TUN devices, tc)"
cannot() { if [ "${CI:-}" = true ]; then fail "$*"; else skip "$*"; fi; }
ip netns add "$NS_A" 2>/dev/null && ip netns add "$NS_B" 2>/dev/null || cannot "cannot make network namespaces"
for ns in "$NS_A" "$NS_B"; do ip netns exec "$ns" ip link set lo up || cannot "no loopback in $ns"; done
ip netns exec "$NS_A" ip tuntap add dev mkt0 mode tun && ip netns exec "$NS_B" ip tuntap add dev mkt1 mode tun ||
  cannot "cannot make TUN devices"
echo "0 0 0 0" >"$CTL"
python3 "$HERE/impair_wire.py" "$NS_A" mkt0 "$NS_B" mkt1 "$CTL" >"$WORK/wire.log" 2>&1 &
WIRE=$!
sleep 0.5
kill -0 "$WIRE" 2>/dev/null || { cat "$WORK/wire.log"; cannot "the user-space wire did not start"; }
ip netns exec "$NS_A" ip addr add 10.23.0.1 peer 10.23.0.2 dev mkt0 && ip netns exec "$NS_A" ip link set mkt0 up &&
  ip netns exec "$NS_B" ip addr add 10.23.0.2 peer 10.23.0.1 dev mkt1 && ip netns exec "$NS_B" ip link set mkt1 up ||
  cannot "cannot address the TUN devices"

MODEL="--random:kv_heads=2"
SPLIT="1,3"
NEW=8
# The whole model in one process: each sequence's tokens.
"$BIN" run "$MODEL" --prompts "$PROMPTS" --max-tokens "$NEW" --max-sequences 1 >"$WORK/whole.out" 2>&1 || fail "the whole-model run failed"
tokens_of() { sed -n 's/^seq \([0-9]*\) .*tokens: *\(.*\)$/\1: \2/p' "$1"; }
tokens_of "$WORK/whole.out" >"$WORK/whole.tok"
[ -s "$WORK/whole.tok" ] || fail "no tokens from the whole model"

now() { date +%s.%N; }
# launch RANK NS TIMEOUT MAX_TOKENS: one rank in its namespace, output in $WORK/rRANK.{out,err}
launch() {
  local rank=$1 ns=$2 timeout=$3 max=$4 extra=()
  [ "$rank" = 0 ] && extra=(--prompts "$PROMPTS" --max-tokens "$max" --max-sequences 2)
  ip netns exec "$ns" "$BIN" stage "$MODEL" --split "$SPLIT" --rank "$rank" --world 3 --rendezvous "10.23.0.1:$PORT" \
    --timeout "$timeout" "${extra[@]}" >"$WORK/r$rank.out" 2>"$WORK/r$rank.err" &
  PIDS[$rank]=$!
}
# reap LIMIT_S: wait for the three ranks, kill what is left; sets RC0..RC2
reap() {
  local limit=$1 t0
  t0=$(now)
  for r in 0 1 2; do
    while kill -0 "${PIDS[$r]}" 2>/dev/null && [ "$(echo "$(now) - $t0 < $limit" | bc)" = 1 ]; do sleep 0.02; done
    if kill -0 "${PIDS[$r]}" 2>/dev/null; then
      kill -9 "${PIDS[$r]}"
      echo "rank $r still running after ${limit}s: killed"
      LEFT=1
    fi
    wait "${PIDS[$r]}"
    eval "RC$r=\$?"
  done
}
shape() { # DELAY_MS HOLD_PERCENT HOLD_MS RATE(kbit or 0)
  local rate=$4 ns dev
  echo "$1 $2 $3 0" >"$CTL"
  for pair in "$NS_A mkt0" "$NS_B mkt1"; do
    read -r ns dev <<<"$pair"
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null
    [ "$rate" = 0 ] || ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${rate}kbit" burst 4kb latency 400ms ||
      fail "tc tbf on $dev"
  done
  sleep 0.1 # the wire reads its settings every 50 ms
}

printf '%-22s %8s %10s %s\n' "condition" "wall s" "tokens/s" "tokens"
PORT=7300
FAILED=0
for cond in "0ms|0 0 0 0" "10ms|10 0 0 0" "50ms|50 0 0 0" "10ms+1%held200ms|10 1 200 0" "256kbit/s|0 0 0 256"; do
  name="${cond%%|*}"
  shape ${cond#*|}
  PORT=$((PORT + 1))
  LEFT=0
  t0=$(now)
  launch 0 "$NS_A" 5 "$NEW"
  launch 1 "$NS_B" 5 0
  launch 2 "$NS_A" 5 0
  reap 60
  wall=$(echo "$(now) - $t0" | bc)
  tokens_of "$WORK/r0.out" >"$WORK/stage.tok"
  rate=$(sed -n 's/^aggregate: .*: \([0-9.]*\) tokens\/s.*/\1/p' "$WORK/r0.out")
  verdict=exact
  if ! cmp -s "$WORK/whole.tok" "$WORK/stage.tok"; then verdict="DIFFER"; fi
  if [ "$RC0$RC1$RC2" != 000 ] || [ "$LEFT" = 1 ]; then verdict="$verdict, exit $RC0/$RC1/$RC2"; fi
  if grep -q "MK_ERR_PEER_TIMEOUT" "$WORK"/r*.err; then verdict="$verdict, TIMEOUT"; fi
  printf '%-22s %8.2f %10s %s\n' "$name" "$wall" "${rate:-?}" "$verdict"
  if [ "$verdict" != exact ]; then
    FAILED=1
    for r in 0 1 2; do echo "--- rank $r"; tail -5 "$WORK/r$r.out" "$WORK/r$r.err"; done
  fi
done

# A cut link mid-run: silence, no reset. Rank 0 names the silent rank within 1.25
# deadlines, reports every request, and every process is gone within 2 deadlines + 3 s.
shape 10 0 0 0
PORT=$((PORT + 1))
LEFT=0
launch 0 "$NS_A" 1 400
launch 1 "$NS_B" 1 0
launch 2 "$NS_A" 1 0
sleep 1.5
grep -q "^stage: rank 0" "$WORK/r0.out" || fail "the run had not started before the cut: $(cat "$WORK/r0.err")"
echo "10 0 0 1" >"$CTL"
cut=$(now)
while kill -0 "${PIDS[0]}" 2>/dev/null && [ "$(echo "$(now) - $cut < 10" | bc)" = 1 ]; do sleep 0.01; done
detect=$(echo "$(now) - $cut" | bc)
reap 5
gone=$(echo "$(now) - $cut" | bc)
n_seq=$(grep -c "^seq " "$WORK/r0.out")
n_prompts=$(grep -cv '^#' "$PROMPTS")
verdict=reported
[ "$n_seq" = "$n_prompts" ] || verdict="$n_seq of $n_prompts requests reported"
grep -q "FAILED MK_ERR_PEER_TIMEOUT: rank 1 is silent" "$WORK/r0.out" || verdict="$verdict, rank 1 not named"
[ "$(echo "$detect < 3" | bc)" = 1 ] || verdict="$verdict, detected late"
[ "$RC0" != 0 ] && [ "$RC1" != 0 ] && [ "$RC2" != 0 ] && [ "$LEFT" = 0 ] || verdict="$verdict, exit $RC0/$RC1/$RC2"
[ "$(echo "$gone < 5" | bc)" = 1 ] || verdict="$verdict, processes left ${gone}s"
printf 'cut link at --timeout 1: rank 0 reported it %.2f s after the cut, every process gone after %.2f s: %s\n' \
  "$detect" "$gone" "$verdict"
if [ "$verdict" != reported ]; then
  FAILED=1
  for r in 0 1 2; do echo "--- rank $r"; tail -5 "$WORK/r$r.out" "$WORK/r$r.err"; done
fi
kill "$WIRE" 2>/dev/null && wait "$WIRE" 2>/dev/null
WIRE=""
echo "wire: $(tail -1 "$WORK/wire.log")"
[ "$FAILED" = 0 ] || fail "see above"
echo "impair_stage_test: OK"
