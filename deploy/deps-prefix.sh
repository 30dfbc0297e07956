#!/usr/bin/env bash
# Prints where deploy/install-python.sh puts what it takes from the package
# index (the CUDA compiler, the Python environment): $KV_DEPS_PREFIX when
# set, else /opt/kvcached-deps for root (or wherever it is writable), else
# ~/.cache/kvcached-deps. Outside the checkout, so a fresh clone (CI's)
# finds a second run's install already there. CMake (CMakeLists.txt) and
# tests/CMakeLists.txt look in the same places.
if [ -n "${KV_DEPS_PREFIX:-}" ]; then
  echo "$KV_DEPS_PREFIX"
elif [ "$(id -u)" -eq 0 ] || [ -w /opt/kvcached-deps ]; then
  echo /opt/kvcached-deps
else
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/kvcached-deps"
fi
