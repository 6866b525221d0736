#!/usr/bin/env bash
# The older spellings of renamed options do exactly what the new ones do: run --n as
# run --max-tokens, run --prompts ... --batch as --max-sequences (the same tokens, text and
# parity lines; timings aside). usage: cli_alias_test.sh MESHKERN PROMPTS_FILE
set -u
bin=$1
prompts=$2
pick() { grep -E 'tokens:|^text:|^parity|^seq |^  text:|^pipeline:|^aggregate: [0-9]+ tokens from'; }
strip() { sed -E 's/ in [0-9.]+ s: [0-9.]+ tokens\/s//'; }
new=$("$bin" run --random --tokens 3,1,4,1,5 --split 2 --max-tokens 7 | pick)
old=$("$bin" run --random --tokens 3,1,4,1,5 --split 2 --n 7 | pick)
[ -n "$new" ] && [ "$new" = "$old" ] || { echo "cli_alias_test: --n differs from --max-tokens"; echo "$new"; echo "$old"; exit 1; }
echo "$new" | grep -q "whole tokens:\( [0-9]*\)\{7\}$" || { echo "cli_alias_test: not 7 tokens"; echo "$new"; exit 1; }
new=$("$bin" run --random --prompts "$prompts" --max-sequences 2 --max-tokens 3 | pick | strip)
old=$("$bin" run --random --prompts "$prompts" --batch 2 --n 3 | pick | strip)
[ -n "$new" ] && [ "$new" = "$old" ] || { echo "cli_alias_test: --batch differs from --max-sequences"; echo "$new"; echo "$old"; exit 1; }
echo "$new" | grep -q "2 sequences in flight" || { echo "cli_alias_test: --max-sequences 2 not taken"; echo "$new"; exit 1; }
echo "cli_alias_test: OK"
