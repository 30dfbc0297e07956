#!/usr/bin/env bash
# Installs, with apt-get, everything kvcached's build, tests and benchmarks
# need on Debian 12. Idempotent: packages already present are skipped, and a
# second run changes nothing. The CUDA toolkit is optional (KV_CUDA=AUTO):
# it is used when nvcc is found, and is not installed here.
# Python (client/python): Debian's /usr/bin/python3 with Debian's torch,
# numpy and pytest (there is no package index to install from); OpenBLAS
# replaces the reference BLAS that torch would otherwise use (about 40x
# slower matrix products).
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  liburing-dev liblmdb-dev lmdb-utils libuv1-dev
  libxxhash-dev libjansson-dev libinih-dev libsodium-dev
  libcriterion-dev clang libclang-rt-14-dev
  fio redis-server redis-tools libhiredis-dev jq
  libhttp-parser-dev libsystemd-dev prometheus curl
  systemd python3-yaml
  python3-torch python3-numpy python3-pytest python3-venv python3-setuptools
  libopenblas0-pthread
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
