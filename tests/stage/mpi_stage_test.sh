#!/bin/sh
# Stage processes launched by mpirun: every sequence's tokens equal the whole model run in
# one process (meshkern run --prompts, same weights), line for line; then the same ranks
# with one of them on another model are refused at startup with the digest error.
# usage: mpi_stage_test.sh MESHKERN MPIEXEC NP MODEL SPLIT MAX_TOKENS PROMPTS DTYPE [ARGS...]
# (ARGS go to both runs, e.g. --backend cuda for the simulated cuda backend; MK_STAGE_EXTRA
# to the stage processes only, e.g. "--seam nccl")
set -eu
bin="$1"; mpiexec="$2"; np="$3"; model="$4"; split="$5"; n="$6"; prompts="$7"; dtype="$8"
shift 8
# ctest runs several of these at once in the same directory: a log of its own each.
mismatch=$(mktemp)
trap 'rm -f "$mismatch"' EXIT
mpirun_() { "$mpiexec" --allow-run-as-root --oversubscribe "$@"; }
want=$("$bin" run "$model" --prompts "$prompts" --max-tokens "$n" --dtype "$dtype" "$@" | grep '^seq ')
out=$(mpirun_ -np "$np" "$bin" stage "$model" --split "$split" --launcher mpi --prompts "$prompts" \
      --max-tokens "$n" --max-sequences 2 --timeout 60 --dtype "$dtype" "$@" ${MK_STAGE_EXTRA:-})
printf '%s\n' "$out"
got=$(printf '%s\n' "$out" | grep '^seq ')
[ -n "$want" ] || { echo "no reference output"; exit 1; }
if [ "$got" != "$want" ]; then
  echo "MISMATCH with the whole model:"; printf '%s\n' "$want"; exit 1
fi
printf '%s\n' "$out" | grep -q "^aggregate: .* over $np processes"
# nccl seams under MPI: every rank joined with the ids rank 0 broadcast (MPI_Bcast).
case "${MK_STAGE_EXTRA:-}" in
  *nccl*) [ "$(printf '%s\n' "$out" | grep -c '^stage: rank .*seam nccl (NCCL ids by MPI_Bcast)')" = "$np" ] ||
            { echo "not every rank joined with MPI_Bcast'ed NCCL ids"; exit 1; } ;;
esac
# The other ranks on another model (another random seed) or, for a GGUF, on another weight
# mode of the same file: the digests differ.
other="$model"; other_dtype=f32
case "$model" in --random*) other="--random:kv_heads=2,seed=7"; other_dtype="$dtype" ;; esac
[ "$dtype" = f32 ] && [ "$other" = "$model" ] && other_dtype=native
if mpirun_ -np 1 "$bin" stage "$model" --split "$split" --launcher mpi --prompts "$prompts" --dtype "$dtype" "$@" ${MK_STAGE_EXTRA:-} : \
          -np $((np - 1)) "$bin" stage "$other" --split "$split" --launcher mpi --dtype "$other_dtype" "$@" ${MK_STAGE_EXTRA:-} \
          > "$mismatch" 2>&1; then
  echo "a run with a rank on another model was not refused"; cat "$mismatch"; exit 1
fi
grep -q "refused at startup: MK_ERR_RECIPE_DIGEST: rank 1's stage digest" "$mismatch" || { cat "$mismatch"; exit 1; }
if grep -q '^seq ' "$mismatch"; then echo "a request ran"; exit 1; fi
echo "mpi stage: ok ($np processes)"
