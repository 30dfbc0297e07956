#!/usr/bin/env bash
# kvbench_daemon.sh - the daemon benchmarks (kvbench lookup, load, store,
# swapin, and the memcpy reference), each run briefly against a test
# kvcached (swapin against one with G3, checking that what it timed was
# read from the SSD): the JSON each prints has its fields, every block
# read back is right, the runs leave no block behind, and usage errors and
# a missing daemon are reported. Performance is printed, never asserted.
source "$(dirname "$0")/lib.bash"

KVB=$BIN/kvbench
RUN=$T/run

expect_exit 1 "load without a daemon fails" "$KVB" load --socket-dir "$RUN" --json --seconds 0.2
grep -q "is kvcached running?" "$T/err" && ok "and says so" || bad "no-daemon message: $(cat "$T/err")"
expect_exit 2 "--clients 0 is a usage error" "$KVB" load --socket-dir "$RUN" --clients 0
expect_exit 2 "bad --seconds" "$KVB" store --socket-dir "$RUN" --seconds soon
expect_exit 2 "an extra argument" "$KVB" lookup --socket-dir "$RUN" extra
expect_exit 0 "lookup --help" "$KVB" lookup --help

"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 32M --set g2.page_size=4M --set g2.lock=no --g3-path "" \
  2>"$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready:" 10; then ok "kvcached ready"; else bad "kvcached ready: $(cat "$T/log")"; finish; exit; fi

num() { jq -e "$1" "$T/out" >/dev/null; } # num FILTER: the filter holds on the last output

expect_exit 0 "kvbench lookup" "$KVB" lookup --socket-dir "$RUN" --json --seconds 0.5 --block-bytes 4096
check "lookup: keys_per_s > 0" num '.keys_per_s > 0'
check "lookup: rtt_p50_us > 0" num '.rtt_p50_us > 0'
check "lookup: rtt_p99_us >= rtt_p50_us" num '.rtt_p99_us >= .rtt_p50_us'
check "lookup: every key of the batch resident" num '.resident == .batch_keys and .batch_keys == 1024'
echo "# lookup: $(jq -c '{keys_per_s, rtt_p50_us, rtt_p99_us}' "$T/out")"

for c in 1 2; do
  expect_exit 0 "kvbench load, $c client(s)" "$KVB" load --socket-dir "$RUN" --json --seconds 0.5 --clients "$c"
  check "load: gbps > 0 ($c)" num '.gbps > 0'
  check "load: every block read back right ($c)" num '.bad_blocks == 0 and .blocks > 0'
  check "load: clients ($c)" num ".clients == $c"
  echo "# load $c: $(jq -c '{gbps, blocks}' "$T/out")"
  expect_exit 0 "kvbench store, $c client(s)" "$KVB" store --socket-dir "$RUN" --json --seconds 0.5 --clients "$c"
  check "store: gbps > 0 ($c)" num '.gbps > 0'
  echo "# store $c: $(jq -c '{gbps}' "$T/out")"
done
expect_exit 0 "kvbench store, 4 clients in a small arena" "$KVB" store --socket-dir "$RUN" --json --seconds 0.3 --clients 4
expect_exit 0 "kvbench memcpy" "$KVB" memcpy --json --seconds 0.3 --blocks 64
check "memcpy: gbps > 0" num '.gbps > 0 and .bad_blocks == 0'
expect_exit 1 "load of more blocks than fit is refused" "$KVB" load --socket-dir "$RUN" --blocks 1000 --seconds 0.2

expect_exit 0 "status after the runs" "$BIN/kvctl" status --worker --json --socket-dir "$RUN"
check "the runs left no block behind" num '.g2.blocks == 0'
expect_exit 1 "swapin without G3 is refused" "$KVB" swapin --socket-dir "$RUN" --seconds 0.2
grep -q "no G3 tier" "$T/err" && ok "and says why" || bad "swapin without G3: $(cat "$T/err")"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached stopped cleanly" || bad "kvcached exit status $rc"

# swapin: a daemon with G3; every block timed was read back from the SSD.
"$BIN/kvcached" --socket-dir "$T/run3" --g2-capacity 32M --set g2.page_size=4M --set g2.lock=no \
  --g3-path "$T/g3" --g3-capacity 64M 2>"$T/log3" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log3" "ready:" 10; then ok "kvcached with G3 ready"; else bad "kvcached with G3: $(cat "$T/log3")"; finish; exit; fi
for c in 1 2; do
  expect_exit 0 "kvbench swapin, $c client(s)" "$KVB" swapin --socket-dir "$T/run3" --json --clients "$c"
  check "swapin: gbps > 0, every block right ($c)" num '.gbps > 0 and .bad_blocks == 0 and .blocks > 0'
  check "swapin: every block timed was read from G3 ($c)" num '.g3_reads == .blocks'
  echo "# swapin $c: $(jq -c '{gbps, blocks, g3_reads}' "$T/out")"
done
expect_exit 0 "status after swapin" "$BIN/kvctl" status --worker --json --socket-dir "$T/run3"
check "swapin left no block behind" num '.g2.blocks == 0'
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached with G3 stopped cleanly" || bad "kvcached with G3 exit status $rc"

# The one-run comparison, in its quick form (about 10 s): it completes and
# every row of its table has numbers.
if command -v fio >/dev/null && command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
  expect_exit 0 "compare.sh --quick" env TMPDIR="$T" bash "$SRC/tools/bench/compare.sh" -b "$BIN" --quick
  check "compare.sh: seven rows with a ratio each" \
    test "$(grep -cE '^\| [^|]+ \| [0-9.]+ \| [0-9.]+ .*\| [0-9.]+ \|$' "$T/out")" -eq 7
  check "compare.sh: the machine is described" grep -q -- "- kernel: " "$T/out"
  sed -n '/^| path/,$p' "$T/out" | sed 's/^/# /'
else
  echo "# fio or redis not found: compare.sh --quick is not run (deploy/install-deps.sh)"
fi
finish
