#!/usr/bin/env bash
# The main job: ask SmolLM2-135M-Instruct a question through two ranges (layers 0-14 |
# 15-29) in one process, each seam packed and unpacked as protobuf. The prompt goes through
# the model's chat template and tokenizer, the answer streams out and stops at <|im_end|>,
# then the whole model answers the same prompt and the script reports whether the split
# gave the same tokens with bit-identical logits. Uses the GPU (cuda backend) when one is
# present, the CPU otherwise. Extra arguments go to `meshkern run` (e.g. -p "...", --max-tokens 64).
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
exec build/tools/meshkern run "$MODEL" -p "What is the capital of France? Answer in one sentence." --split 14 --max-tokens 128 --backend "$BACKEND" "$@"
