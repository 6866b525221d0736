#!/bin/sh
# meshkern stage --text: each line of the prompts file is a user message through the
# model's chat template; rank 0's answer to each equals, as text, the single-process
# `meshkern run -p` answer to the same question with the same weights.
# usage: text_stage_test.sh MESHKERN MODEL SPLIT [ARGS...]  (ARGS to both, e.g. --dtype f32)
set -eu
bin="$1"; model="$2"; split="$3"
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '%s\n' "What is the capital of France?" "" "What is 2+2?" "Name a primary colour." > "$dir/questions.txt"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 120 "$bin" stage "$model" --split "$split" --rank 1 --world 2 --rendezvous "127.0.0.1:$port" --timeout 60 \
  "$@" > "$dir/rank1.log" 2>&1 &
pid=$!
rc=0
timeout 120 "$bin" stage "$model" --split "$split" --rank 0 --world 2 --rendezvous "127.0.0.1:$port" --timeout 60 \
  --text --prompts "$dir/questions.txt" --max-tokens 48 --max-sequences 2 "$@" > "$dir/rank0.log" 2>&1 || rc=$?
wait "$pid" || rc=$?
cat "$dir/rank0.log" "$dir/rank1.log"
[ "$rc" = 0 ] || { echo "a rank failed (exit $rc)"; exit 1; }
i=0
while IFS= read -r q; do
  [ -n "$q" ] || continue
  i=$((i + 1))
  # run -p prints the answer between the ranges line and the [end of turn] / [token limit] line
  want=$("$bin" run "$model" -p "$q" --max-tokens 48 "$@" | awk '/^\[(end of turn|token limit)\]/ { on = 0 } on { print } /^ranges:/ { on = 1 }')
  # the stage's answer: from its "answer i: " line up to the next line rank 0 starts itself
  got=$(awk -v head="answer $i: " '/^(seq [0-9]+ |answer [0-9]+: |aggregate: )/ { on = 0 }
        index($0, head) == 1 { on = 1; print substr($0, length(head) + 1); next } on { print }' "$dir/rank0.log")
  [ -n "$want" ] || { echo "no answer from run -p to: $q"; exit 1; }
  if [ "$got" != "$want" ]; then
    echo "question $i ($q): stage answered '$got', run -p '$want'"; exit 1
  fi
  echo "question $i: '$got' (as run -p)"
done < "$dir/questions.txt"
[ "$i" = 3 ] && [ "$(grep -c '^answer ' "$dir/rank0.log")" = 3 ] || { echo "not 3 answers"; exit 1; }

# A --stop id is not part of the answer's text (as a stop sequence in OpenAI's API): stopped at
# the id of the last token before the end of turn in question 2's answer, the answer is that
# answer less the stop token's text.
last=$(sed -n 's/^seq 2 ([0-9]* prompt tokens): stopped, [0-9]* tokens: \(.*\) [0-9][0-9]*$/\1/p' "$dir/rank0.log" | awk '{print $NF}')
[ -n "$last" ] || { echo "question 2 did not stop at its end of turn: no stop id to try"; exit 1; }
printf '%s\n' "What is 2+2?" > "$dir/q2.txt"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 120 "$bin" stage "$model" --split "$split" --rank 1 --world 2 --rendezvous "127.0.0.1:$port" --timeout 60 \
  "$@" > "$dir/stop1.log" 2>&1 &
pid=$!
timeout 120 "$bin" stage "$model" --split "$split" --rank 0 --world 2 --rendezvous "127.0.0.1:$port" --timeout 60 \
  --text --prompts "$dir/q2.txt" --max-tokens 48 --stop "$last" "$@" > "$dir/stop0.log" 2>&1 || { cat "$dir/stop0.log"; exit 1; }
wait "$pid" || { cat "$dir/stop1.log"; exit 1; }
full=$(sed -n 's/^answer 2: //p' "$dir/rank0.log")
cut=$(sed -n 's/^answer 1: //p' "$dir/stop0.log")
case "$full" in
  "$cut"?*) echo "stop id $last: '$cut' (the answer without it)" ;;
  *) echo "stop id $last: answered '$cut', expected a proper prefix of '$full'"; exit 1 ;;
esac
echo "stage --text: ok"
