#!/bin/sh
# Stage processes joined through the rendezvous address, no MPI: every sequence's tokens
# equal the whole model run in one process, line for line, and the ranks name how they met
# (for nccl seams: the ids came in rank 0's welcome, not by MPI_Bcast).
# usage: rendezvous_stage_test.sh MESHKERN NP MODEL SPLIT MAX_TOKENS PROMPTS DTYPE SEAM [ARGS...]
set -eu
bin="$1"; np="$2"; model="$3"; split="$4"; n="$5"; prompts="$6"; dtype="$7"; seam="$8"
shift 8
want=$("$bin" run "$model" --prompts "$prompts" --max-tokens "$n" --dtype "$dtype" "$@" | grep '^seq ')
[ -n "$want" ] || { echo "no reference output"; exit 1; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=""
r=1
while [ "$r" -lt "$np" ]; do
  timeout 120 "$bin" stage "$model" --split "$split" --rank "$r" --world "$np" --rendezvous "127.0.0.1:$port" \
    --timeout 60 --dtype "$dtype" --seam "$seam" "$@" > "$dir/rank$r.log" 2>&1 &
  pids="$pids $!"
  r=$((r + 1))
done
rc=0
timeout 120 "$bin" stage "$model" --split "$split" --rank 0 --world "$np" --rendezvous "127.0.0.1:$port" \
  --prompts "$prompts" --max-tokens "$n" --max-sequences 2 --timeout 60 --dtype "$dtype" --seam "$seam" "$@" \
  > "$dir/rank0.log" 2>&1 || rc=$?
for p in $pids; do wait "$p" || rc=$?; done
cat "$dir"/rank*.log
[ "$rc" = 0 ] || { echo "a rank failed (exit $rc)"; exit 1; }
got=$(grep '^seq ' "$dir/rank0.log")
if [ "$got" != "$want" ]; then
  echo "MISMATCH with the whole model:"; printf '%s\n' "$want"; exit 1
fi
[ "$(cat "$dir"/rank*.log | grep -c "^stage: rank .*seam $seam, ")" = "$np" ] ||
  { echo "not every rank joined by the rendezvous over the $seam seam"; exit 1; }
echo "rendezvous stage: ok ($np processes, $seam seam)"
