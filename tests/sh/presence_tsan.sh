#!/usr/bin/env bash
# presence_tsan.sh - the presence table's race tests (tests/unit/
# test_presence_table.c: a writer and readers in threads, and in processes
# sharing a memfd) built with ThreadSanitizer and run: no data race may be
# reported, and every answer must be a state its key had during the call.
# Criterion's runner does not start under TSan, so the tests are built as
# one program with a shim of its macros (tests/lib/criterion_shim). Skipped
# (77) where the compiler cannot build with -fsanitize=thread.
# usage: presence_tsan.sh BIN_DIR SOURCE_DIR
set -u
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cc=${CC:-cc}
cat >"$T/main.c" <<'C'
#include "tests/unit/test_presence_table.c"
int main(void) {
  race_threads_never_see_an_answer_older_than_the_call();
  race_processes_mapping_a_memfd_never_see_an_answer_older_than_the_call();
  table_fills_past_nine_tenths_and_a_failed_insert_changes_nothing();
  puts("presence_tsan: ok");
  return 0;
}
C
echo 'int main(void){return 0;}' >"$T/probe.c"
# TSan's runtime refuses some address-space layouts (high mmap randomness):
# then it runs without randomization (setarch -R), if that is allowed here.
run=()
if ! "$cc" -fsanitize=thread "$T/probe.c" -o "$T/probe" 2>/dev/null; then
  echo "presence_tsan: $cc cannot build with -fsanitize=thread here: skipped"
  exit 77
fi
if ! "$T/probe" 2>/dev/null; then
  if setarch "$(uname -m)" -R "$T/probe" 2>/dev/null; then
    run=(setarch "$(uname -m)" -R)
  else
    echo "presence_tsan: a ThreadSanitizer program does not start here: skipped"
    exit 77
  fi
fi
"$cc" -std=gnu11 -O1 -g -fsanitize=thread -D_GNU_SOURCE -I"$src/tests/lib/criterion_shim" \
  -I"$src" "$T/main.c" "$src/proto/presence.c" "$src/client/presence.c" -lpthread \
  -o "$T/race" || { echo "presence_tsan: build failed"; exit 1; }
TSAN_OPTIONS="halt_on_error=1 exitcode=66" "${run[@]}" "$T/race" >"$T/out" 2>&1
rc=$?
cat "$T/out"
if [ $rc -ne 0 ] || grep -q "ThreadSanitizer" "$T/out"; then
  echo "presence_tsan: FAILED (exit $rc)"
  exit 1
fi
echo "presence_tsan: no race reported"
