#!/usr/bin/env bash
# One run of the command-line program against what it must do: its exit status, and lines
# its output (stdout and stderr together) must hold.
#   cli_expect.sh RC [-e REGEX]... -- COMMAND [ARGS...]
# Every REGEX (grep -E) must match some line. A usage error (RC 2) must also be exactly one
# line on stderr, naming the command's --help, and nothing on stdout.
set -u
want_rc=$1
shift
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  [ "$1" = "-e" ] || { echo "cli_expect: expected -e REGEX or --, got '$1'"; exit 1; }
  regexes+=("$2")
  shift 2
done
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$@" >"$work/out" 2>"$work/err" </dev/null
rc=$?
show() { echo "--- stdout"; cat "$work/out"; echo "--- stderr"; cat "$work/err"; }
if [ "$rc" != "$want_rc" ]; then
  echo "cli_expect: exit status $rc, want $want_rc: $*"; show; exit 1
fi
for re in "${regexes[@]}"; do
  if ! cat "$work/out" "$work/err" | grep -Eq -- "$re"; then
    echo "cli_expect: no line matches /$re/: $*"; show; exit 1
  fi
done
if [ "$want_rc" = 2 ]; then
  lines=$(wc -l <"$work/err")
  if [ "$lines" != 1 ] || [ -s "$work/out" ] || ! grep -Eq "; see 'meshkern( [a-z]+)? --help'$" "$work/err"; then
    echo "cli_expect: a usage error is one line on stderr ending in the --help pointer, nothing on stdout: $*"; show; exit 1
  fi
fi
echo "cli_expect: OK"
