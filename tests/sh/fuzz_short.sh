#!/usr/bin/env bash
# fuzz_short.sh - builds the libFuzzer target for the wire decoders and the
# frame reader (tests/fuzz/fuzz_decode.c) in a temporary directory with clang
# and runs it for a short while (20 s; KV_FUZZ_SECONDS overrides), seeded
# with valid frames of every opcode. Skips, saying why, when clang or its
# libFuzzer runtime is missing. A crash or a broken property fails the test
# and leaves the reproducer in the printed directory.
# Usage: fuzz_short.sh BIN_DIR SOURCE_DIR
set -euo pipefail

src=${2:?usage: fuzz_short.sh BIN_DIR SOURCE_DIR}
secs=${KV_FUZZ_SECONDS:-20}

cc=""
for c in clang clang-14 clang-15 clang-16 clang-17 clang-18; do
  if command -v "$c" >/dev/null 2>&1; then cc=$c; break; fi
done
if [ -z "$cc" ]; then
  echo "fuzz_short: SKIP: clang is not installed (apt-get install clang)"
  exit 77
fi

tmp=$(mktemp -d /tmp/kv-fuzz-XXXXXX)
keep=0
cleanup() { if [ "$keep" = 0 ]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT

echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$tmp/probe.c"
if ! "$cc" -fsanitize=fuzzer "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
  echo "fuzz_short: SKIP: $cc has no libFuzzer runtime (-fsanitize=fuzzer)"
  exit 77
fi

sources=("$src"/base/errors.c "$src"/base/buf.c "$src"/proto/wire.c "$src"/proto/wire_enc.c
         "$src"/proto/wire_dec.c "$src"/ipc/reader.c "$src"/ipc/sock.c)
flags=(-std=gnu11 -D_GNU_SOURCE -I"$src" -g -O1 -Wall -Wextra -Wno-unused-parameter)

echo "fuzz_short: building with $cc in $tmp"
"$cc" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$src"/tests/fuzz/fuzz_decode.c "${sources[@]}" -o "$tmp/fuzz_decode"
"$cc" "${flags[@]}" "$src"/tests/fuzz/seeds.c "${sources[@]}" -o "$tmp/fuzz_seeds"
"$tmp/fuzz_seeds" "$tmp/corpus"

echo "fuzz_short: fuzzing for ${secs}s"
if ! (cd "$tmp" && ./fuzz_decode -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 corpus 2>"$tmp/fuzz.log"); then
  keep=1
  tail -n 40 "$tmp/fuzz.log"
  echo "fuzz_short: FAIL: reproducer and log kept in $tmp"
  exit 1
fi
grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::new_units_added)' "$tmp/fuzz.log" || true
echo "fuzz_short: ok"
