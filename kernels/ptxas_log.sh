#!/usr/bin/env bash
# CUDA compiler launcher for meshkern_kernels_cuda: runs the compile command unchanged and
# keeps its diagnostics (the `-Xptxas -v` resource report) beside the object as
# <object>.ptxas.log, for ptxas_check.cmake. The output is also passed through.
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
log="${out:-ptxas_unknown.o}.ptxas.log"
"$@" >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then cat "$log" >&2; fi
exit $rc
