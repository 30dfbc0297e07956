#!/usr/bin/env bash
# Installs everything kvcached's build, tests and benchmarks need on Debian
# 12: Debian's packages with apt-get, then (deploy/install-python.sh) the
# CUDA compiler from NVIDIA's wheels and the Python environment of the tests
# and engines from the package index, every version pinned in
# deploy/python/requirements.lock. Idempotent: what is present is skipped,
# and a second run installs nothing.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  liburing-dev liblmdb-dev lmdb-utils libuv1-dev
  libxxhash-dev libjansson-dev libinih-dev libsodium-dev libssl-dev zlib1g-dev libzstd-dev
  libcriterion-dev clang libclang-rt-14-dev
  fio redis-server redis-tools libhiredis-dev jq
  libhttp-parser-dev libsystemd-dev prometheus curl
  systemd python3-yaml python3-venv
  dpkg-dev file man-db adduser   # cpack -G DEB (dpkg-shlibdeps), the packages' test
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} Debian packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/install-python.sh"
echo "install-deps: done"
