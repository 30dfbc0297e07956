#!/usr/bin/env bash
# tests/gpu/run.sh - builds the GPU programs (tests/gpu/gpu_*.c) with
# -DKV_CUDA=ON into build-gpu, runs every build-gpu/bin/gpu_test_* and then
# every gpu_bench_*, then the Python ones (tests/gpu/gpu_test_*.py, then
# gpu_bench_*.py: the Python package and the reference engine on the device,
# when python3 has torch with CUDA), prints a summary. Exit 0: all ran and
# passed; 1: one failed (or could not start); 77: nothing ran (no CUDA
# device: the reason is printed). Each program's exit status and wall time
# follow its output.
#
#   tests/gpu/run.sh             build, then run
#   tests/gpu/run.sh --no-build  run what build-gpu already holds (a GPU
#                                machine without cmake or a package registry)
#   tests/gpu/run.sh --bundle    build, then copy into build-gpu/lib/deps the
#                                shared libraries the programs need that a
#                                bare machine may lack (everything ldd names
#                                beyond glibc's own; never the driver,
#                                libcuda, which comes with the GPU); --no-build
#                                --bundle bundles an existing build. Does not run.
# Environment: KV_GPU_BUILD (build directory, default <repo>/build-gpu),
# KV_BENCH_RUNS (passed to the benchmarks), KV_GPU_ONLY (a regular
# expression: run only the programs whose names match), KV_GPU_OUT (a
# directory for the programs' JSON results, when they write any).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
bd=${KV_GPU_BUILD:-$root/build-gpu}
build=1
bundle=0
for a in "$@"; do
  case $a in
    --no-build) build=0 ;;
    --bundle) bundle=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $a (try --help)" >&2; exit 2 ;;
  esac
done

if [ $build = 1 ]; then
  command -v cmake >/dev/null || { echo "run.sh: cmake not found; use --no-build with a prebuilt $bd" >&2; exit 1; }
  targets=()
  for src in "$root"/tests/gpu/gpu_*.c "$root"/tests/gpu/gpu_*.cu; do
    [ -e "$src" ] || continue
    n=${src##*/}; targets+=(--target "${n%.*}")
  done
  targets+=(--target kvclient --target kvcached)  # the Python programs' library and daemon
  cmake -S "$root" -B "$bd" -DKV_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$bd.cmake.log" 2>&1 ||
    { cat "$bd.cmake.log"; echo "run.sh: configure failed" >&2; exit 1; }
  cmake --build "$bd" -j"$(nproc)" "${targets[@]}" || { echo "run.sh: build failed" >&2; exit 1; }
fi

shopt -s nullglob
progs=("$bd"/bin/gpu_test_* "$bd"/bin/gpu_bench_*)
if [ ${#progs[@]} = 0 ]; then
  echo "run.sh: no programs in $bd/bin (build first, or drop --no-build)" >&2
  exit 1
fi

if [ $bundle = 1 ]; then
  mkdir -p "$bd/lib/deps"
  # glibc's own libraries and the loader are on every machine; the driver
  # (libcuda, libnvidia-*) must be the machine's own.
  skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so|libcuda\.so|libnvidia-)'
  n=0
  # gpu_test_daemon runs the daemon built beside it: its libraries too.
  for p in "${progs[@]}" "$bd/bin/kvcached" "$bd"/lib/libkvclient.so; do
    while read -r name path; do
      [ -n "$path" ] && [ -f "$path" ] || continue
      [[ $name =~ $skip ]] && continue
      if [ ! -e "$bd/lib/deps/$name" ]; then
        cp -L "$path" "$bd/lib/deps/$name" && n=$((n + 1))
      fi
    done < <(ldd "$p" | awk '$2 == "=>" {print $1, $3}')
  done
  echo "run.sh: $n librar$([ $n = 1 ] && echo y || echo ies) bundled into $bd/lib/deps:"
  ls "$bd/lib/deps"
  exit 0
fi

only=${KV_GPU_ONLY:-.}
pass=() fail=() skip=()
run_one() { # name, command...
  local name=$1; shift
  echo "== $name"
  local t0=$(date +%s.%N)
  "$@"
  local rc=$?
  echo "== $name: exit $rc, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
  case $rc in
    0) pass+=("$name") ;;
    77) skip+=("$name") ;;
    *) fail+=("$name") ;;
  esac
}
for p in "$bd"/bin/gpu_test_* "$bd"/bin/gpu_bench_*; do
  name=${p##*/}
  [[ $name =~ $only ]] || continue
  missing=$(LD_LIBRARY_PATH="$bd/lib/deps" ldd "$p" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [ -n "$missing" ]; then
    echo "== $name: cannot start, missing: $missing(run --bundle where it was built)"
    fail+=("$name"); continue
  fi
  run_one "$name" env LD_LIBRARY_PATH="$bd/lib/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$p"
done

# The Python programs. The interpreter keeps its own libraries (its
# libstdc++, torch's CUDA runtime): it gets only those of the bundle that
# this machine lacks, and the daemon runs with the whole bundle.
py=$(command -v python3)
pyprogs=()
for p in "$root"/tests/gpu/gpu_test_*.py "$root"/tests/gpu/gpu_bench_*.py; do
  n=${p##*/}; [[ ${n%.py} =~ $only ]] && pyprogs+=("$p")
done
if [ ${#pyprogs[@]} -gt 0 ]; then
  if [ -z "$py" ] || ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "== Python programs skipped: no python3 with torch and a CUDA device"
    for p in "${pyprogs[@]}"; do n=${p##*/}; skip+=("${n%.py}"); done
  else
    pylib=$(mktemp -d)
    for l in $(ldd "$bd/lib/libkvclient.so" | awk '/not found/ {print $1}'); do
      case $l in libcudart*) continue ;; esac  # torch's own, loaded first
      [ -e "$bd/lib/deps/$l" ] && ln -s "$bd/lib/deps/$l" "$pylib/$l"
    done
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$bd/lib/deps" "$bd/bin/kvcached" > "$pylib/kvcached"
    chmod +x "$pylib/kvcached"
    for p in "${pyprogs[@]}"; do
      n=${p##*/}
      run_one "${n%.py}" env LD_LIBRARY_PATH="$pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        KVCLIENT_LIB="$bd/lib/libkvclient.so" KVCACHED_BIN="$pylib/kvcached" PYTHONUNBUFFERED=1 \
        "$py" "$p"
    done
    rm -rf "$pylib"
  fi
fi
echo "== summary: ${#pass[@]} passed, ${#fail[@]} failed, ${#skip[@]} skipped"
[ ${#fail[@]} = 0 ] || { echo "   failed: ${fail[*]}"; exit 1; }
[ ${#pass[@]} -gt 0 ] || exit 77
exit 0
