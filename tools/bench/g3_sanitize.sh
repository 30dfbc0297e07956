#!/usr/bin/env bash
# g3_sanitize.sh - the G3 tier under the sanitizers, in build directories of
# its own: every G3 test (ctest -R g3) under AddressSanitizer +
# UndefinedBehaviorSanitizer, then the threaded code under ThreadSanitizer.
# Criterion cannot start under TSan (Snaipe/Criterion#274), so the TSan pass
# runs the stress test built standalone (tests/unit/test_g3_stress.c with
# -DKV_G3_STANDALONE: both backends, concurrent writes, verified reads,
# removes, injected errors, a reopen) and `kvbench g3` on both backends.
#
# usage: tools/bench/g3_sanitize.sh [asan|tsan|all]   (default all)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
what=${1:-all}
jobs=$(nproc)

if [ "$what" = asan ] || [ "$what" = all ]; then
  cmake -S "$root" -B "$root/build-g3-asan" -DASAN=ON -DUBSAN=ON >/dev/null
  cmake --build "$root/build-g3-asan" -j"$jobs" >/dev/null
  (cd "$root/build-g3-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
     ctest -R g3 --output-on-failure)
fi

if [ "$what" = tsan ] || [ "$what" = all ]; then
  b="$root/build-g3-tsan"
  cmake -S "$root" -B "$b" -DTSAN=ON -DKV_TESTS=OFF >/dev/null
  cmake --build "$b" -j"$jobs" --target kvbench g3_stress >/dev/null  # g3_stress: tests/tsan
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  "$b/bin/g3_stress" 20000 2>&1 | grep -v ' info g3: '
  tmp=$(mktemp -d /tmp/g3-tsan.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  for be in threads uring; do
    "$b/bin/kvbench" g3 --dir "$tmp" --block-bytes 64K --qd 8 --count 2000 --backend "$be" \
      --json 2>&1 | grep -v ' info g3: '
  done
  "$b/bin/kvbench" g3 --dir "$tmp" --block-bytes 64K --qd 8 --count 500 --backend threads --keep \
    >/dev/null 2>&1
  rm -f "$tmp/kvg3-index.mdb" "$tmp/kvg3-index.mdb-lock"
  "$b/bin/kvbench" g3 rebuild --dir "$tmp" --json 2>/dev/null
  echo "g3_sanitize: TSan pass clean"
fi
