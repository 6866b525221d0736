#!/bin/sh
# The text commands as a person uses them: `run -p` through a 2-range split (the answer,
# the stop at <|im_end|>, parity with the whole model), `run --raw` stopping at --max-tokens, and a two-question `chat` through a
# pipe (the second turn keeps the KV cache; a typed control token's text stays text). The answers are checked in the F32 parity mode
# (--dtype f32); the default on the cpu backend is native weights, run once through a unix
# seam: the weights line, the seam and exact parity. usage: cli_text_test.sh MESHKERN MODEL
set -eu
bin="$1"
model="$2"
out=$("$bin" run "$model" -p "What is the capital of France?" --split 14 --max-tokens 64 --dtype f32)
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -qx "The capital of France is Paris."
printf '%s\n' "$out" | grep -q "^\[end of turn\] prompt 37 tokens.*generated 7 tokens.*stopped at <|im_end|>$"
printf '%s\n' "$out" | grep -q "^parity: exact"
raw=$("$bin" run "$model" -p "The capital of France is" --raw --max-tokens 4 --dtype f32)
printf '%s\n' "$raw"
printf '%s\n' "$raw" | grep -q "^chat template none (--raw); prompt 5 tokens$"
printf '%s\n' "$raw" | grep -qx " Paris."
printf '%s\n' "$raw" | grep -q "^\[token limit\] prompt 5 tokens.*generated 4 tokens"
chat=$(printf 'What is the capital of France?\nAnd of Italy?\n' | "$bin" chat "$model" --split 14 --max-tokens 64 --dtype f32 2>&1)
printf '%s\n' "$chat"
printf '%s\n' "$chat" | grep -qx "The capital of France is Paris."
printf '%s\n' "$chat" | grep -qx "The capital of Italy is Rome."
printf '%s\n' "$chat" | grep -q "(cache kept), 7 generated, end of turn"
# a typed line holding a control token's text stays text, as through run -p: the same count
# of prompt tokens (the token itself would take one, the text seven)
q='Say <|im_end|> please.'
fed=$(printf '%s\n' "$q" | "$bin" chat "$model" --max-tokens 1 2>&1 | sed -n 's/^\[\([0-9]*\) prompt tokens fed.*/\1/p')
want=$("$bin" run "$model" -p "$q" --max-tokens 1 | sed -n 's/^chat template .*; prompt \([0-9]*\) tokens$/\1/p')
echo "chat fed $fed prompt tokens for '$q'; run -p: $want"
[ -n "$fed" ] && [ "$fed" = "$want" ]
native=$("$bin" run "$model" -p "What is the capital of France?" --split 14 --max-tokens 12 --seam unix)
printf '%s\n' "$native"
printf '%s\n' "$native" | grep -q "; backend cpu, weights native, seams unix$"
printf '%s\n' "$native" | grep -q "^parity: exact"
# run --prompts --text: one user message per line, batched in one step per token through 2
# stages: each answer is the one run -p gives alone (native weights), ended at <|im_end|>
prompts=$(mktemp)
trap 'rm -f "$prompts"' EXIT
printf 'What is the capital of France?\n\nName a primary colour.\nWhat is the capital of Italy?\n' >"$prompts"
batch=$("$bin" run "$model" --prompts "$prompts" --text --split 14 --max-tokens 24 --max-sequences 3)
printf '%s\n' "$batch"
printf '%s\n' "$batch" | grep -q "^aggregate: .* from 3 sequences"
for q in "What is the capital of France?" "Name a primary colour." "What is the capital of Italy?"; do
  alone=$("$bin" run "$model" -p "$q" --max-tokens 24 | sed -n '/^ranges:/,/^\[/p' | sed '1d;$d')
  printf '%s\n' "$batch" | grep -qxF "  text: $(printf '%s' "$alone" | head -n 1)" ||
    { echo "run --prompts --text: no answer equal to run -p's for '$q' ($alone)"; exit 1; }
done
echo "cli text: ok"
