#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct split into two ranges (layers 0-14 | 15-29) in one
# process, each seam packed and unpacked as protobuf, greedy generation compared with the
# whole model. Uses the GPU (cuda backend) when one is present, the CPU otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/cuda/bin"
scripts/deps.sh
MODEL="$(scripts/fetch_model.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_TESTS=OFF >/dev/null
ninja -C build meshkern_cli >/dev/null
BACKEND=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then BACKEND=cuda; fi
# "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
PROMPT=1,4093,198,1780,314,260,3575,282,4649,47,2,198,1,520,9531,198
exec build/tools/meshkern run "$MODEL" --tokens "$PROMPT" --split 14 --n 32 --backend "$BACKEND" "$@"
