#!/usr/bin/env bash
# Install what meshkern builds and tests with, from Debian's packages, when missing.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is used when present; without it the build has
# the CPU backend and the simulator only.
set -euo pipefail
packages=(cmake ninja-build pkg-config g++ libprotobuf-c-dev protobuf-c-compiler libopenblas-dev
          libgtest-dev libssl-dev libpcre2-dev python3 python3-pip python3-venv openmpi-bin libopenmpi-dev
          patchelf xz-utils libmicrohttpd-dev libcjson-dev curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# meshkern serve's tests speak to it with the openai client (PyPI).
if ! python3 -c "import openai" >/dev/null 2>&1; then
  echo "deps: installing the openai Python package"
  python3 -m pip install -q openai || python3 -m pip install -q --break-system-packages openai
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "deps: add /usr/local/cuda/bin to PATH for nvcc"
fi
