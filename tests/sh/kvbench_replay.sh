#!/usr/bin/env bash
# kvbench_replay.sh - `kvbench replay` against a test kvcached (small G2,
# G3 on): the first 200 requests of the Mooncake trace by 2 clients, with
# no waiting. Its JSON has every field, the rates are in [0, 1], no block
# fails verification, the daemon's counters agree with the clients' own
# (commits, allocations, keys looked up), a second replay of the
# same requests hits what the first stored, a block stored under a trace
# key with the wrong bytes is caught as a verify failure, and usage errors
# and a missing daemon are reported; --hints sends a session trace's hints
# (counted by the daemon); a request longer than a connection's share of
# G2 is stored and loaded whole, a share at a time, and --store-batch
# stores it a batch at a time. Performance is printed, never asserted.
source "$(dirname "$0")/lib.bash"

KVB=$BIN/kvbench
RUN=$T/run
TRACE=$(mooncake_trace)
command -v jq >/dev/null || { echo "skip: jq not found (deploy/install-deps.sh)"; exit 77; }

expect_exit 2 "replay without --trace" "$KVB" replay --socket-dir "$RUN"
expect_exit 2 "bad --time-scale" "$KVB" replay --trace "$TRACE" --time-scale fast
expect_exit 2 "bad --block-bytes (not a multiple of 8)" "$KVB" replay --trace "$TRACE" --block-bytes 1001
expect_exit 2 "bad --deal" "$KVB" replay --trace "$TRACE" --deal random
expect_exit 2 "--hints takes no value" "$KVB" replay --trace "$TRACE" --hints=yes
expect_exit 2 "bad --store-batch" "$KVB" replay --trace "$TRACE" --store-batch 99999
expect_exit 0 "replay --help" "$KVB" replay --help
expect_exit 1 "replay without a daemon fails" "$KVB" replay --trace "$TRACE" --socket-dir "$RUN" --limit 5 --time-scale 0
grep -q "is kvcached running?" "$T/err" && ok "and says so" || bad "no-daemon message: $(cat "$T/err")"
echo '{"timestamp": 0, "input_length": 3, "hash_ids": "nope"}' >"$T/bad.jsonl"
expect_exit 1 "a malformed trace is refused" "$KVB" replay --trace "$T/bad.jsonl" --socket-dir "$RUN"
grep -q "bad.jsonl:1" "$T/err" && ok "with its line" || bad "bad-trace message: $(cat "$T/err")"

"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 16M --set g2.page_size=4M --set g2.lock=no \
  --g3-path "$T/g3" --g3-capacity 64M 2>"$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready:" 10; then ok "kvcached ready"; else bad "kvcached ready: $(cat "$T/log")"; finish; exit; fi

num() { jq -e "$1" "$T/out" >/dev/null; } # num FILTER: the filter holds on the last output
replay() { "$KVB" replay --trace "$TRACE" --socket-dir "$RUN" --json --time-scale 0 "$@"; }

# The daemon's LOOKUP (KVCACHED_LOOKUP=daemon): the cross-check below
# compares the keys the clients looked up with those the daemon counted,
# and a lookup answered from a worker's presence table is not counted there.
KVCACHED_LOOKUP=daemon expect_exit 0 "replay of 200 requests by 2 clients" replay --limit 200 \
  --clients 2
for f in prefix_hit_rate block_hit_rate hits.g2 hits.g3 bytes.g2_to_g3 bytes.g3_to_g2 \
         bytes.client_read bytes.client_written requests_per_s lookup_us.p50 lookup_us.p99 \
         load_us.p50 load_us.p99 verify_failures daemon.core.commits; do
  check "field $f" num ".$f | type == \"number\""
done
check "200 requests, 2 clients" num '.requests == 200 and .clients == 2'
check "rates in [0, 1]" num '[.prefix_hit_rate, .block_hit_rate] | all(. >= 0 and . <= 1)'
check "no verify failure" num '.verify_failures == 0'
check "hits per tier add up to the hit blocks" num '.hits.g2 + .hits.g3 == .blocks.hit'
check "one lookup sample per request, p99 >= p50" num '.lookup_us.count == 200 and .lookup_us.p99 >= .lookup_us.p50'
check "daemon commits == client commits" num '.cross_check.commits.client == .cross_check.commits.daemon and .blocks.committed > 0'
check "daemon allocs == client allocs" num '.cross_check.allocs.client == .cross_check.allocs.daemon'
check "daemon lookups == keys the clients looked up" num '.cross_check.lookup_keys.client == .cross_check.lookup_keys.daemon and .cross_check.lookup_keys.client == .blocks.referenced'
check "bytes written == committed blocks x block size" num '.bytes.client_written == .blocks.committed * .block_bytes'
echo "# first: $(jq -c '{prefix_hit_rate, block_hit_rate, hits, requests_per_s, lookup_us, load_us}' "$T/out")"

# The same requests again, dealt by hash and waiting for room: what the
# first run stored is found.
expect_exit 0 "the same 200 requests again" replay --limit 200 --clients 2 --deal hash --alloc-wait-ms 20
check "the second run hits blocks the first stored" num '.blocks.hit > 0 and .block_hit_rate > 0'
check "and verifies them" num '.verify_failures == 0 and .bytes.client_read == .blocks.hit * .block_bytes'
echo "# second: $(jq -c '{prefix_hit_rate, block_hit_rate, hits}' "$T/out")"

# Engine hints from a trace with sessions (the agentic format: session,
# agent, stop): every request of a session sends SESSION of its hit keys
# (before its stores: requests 2 and 3 hit), SESSION of the keys it
# stores (after their ALLOC, before their COMMIT: the daemon takes them
# uncommitted) and FINISHED; the daemon counts them by kind and stop
# reason, and a request without a session sends none.
cat >"$T/sessions.jsonl" <<'TRACE'
{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3], "session": 1, "agent": "", "stop": "tool_use"}
{"timestamp": 5, "input_length": 1000, "output_length": 5, "hash_ids": [50, 51], "session": 2, "agent": "", "stop": "end_turn"}
{"timestamp": 9, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 3, 4], "session": 1, "agent": "", "stop": "end_turn"}
{"timestamp": 12, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2, 90], "session": 1, "agent": "sub-1", "stop": "tool_use"}
{"timestamp": 15, "input_length": 1000, "output_length": 5, "hash_ids": [70, 71]}
TRACE
expect_exit 0 "replay of a session trace with --hints, dealt by session" \
  "$KVB" replay --trace "$T/sessions.jsonl" --socket-dir "$RUN" --json --time-scale 0 --clients 2 \
  --deal session --hints
check "two hints per request of a session, three with a hit, none without one" \
  num '.hints.on and .hints.sent == 10 and .hints.trace_requests_with_session == 4 and .deal == "session"'
check "every hinted key was there" num '.hints.keys_unmatched == 0'
if command -v curl >/dev/null; then
  curl -sf --unix-socket "$RUN/kvcached-stats.sock" http://localhost/metrics >"$T/metrics"
  grep -q '^kvcached_hint_finished_total{stop="tool_use"} 2$' "$T/metrics" &&
    grep -q '^kvcached_hint_finished_total{stop="end_turn"} 2$' "$T/metrics" &&
    grep -q '^kvcached_hints_total{kind="session"} 6$' "$T/metrics" &&
    ok "the daemon counted them by kind and stop reason" ||
    bad "hint counters: $(grep hint "$T/metrics")"
else
  echo "# curl not found: the daemon's hint counters are not read"
fi
expect_exit 0 "the same trace without --hints" \
  "$KVB" replay --trace "$T/sessions.jsonl" --socket-dir "$RUN" --json --time-scale 0
check "sends none" num '(.hints.on | not) and .hints.sent == 0'

# A request longer than the connection's share of G2 (limits.session_share,
# 50%: 32 of a 4 MiB G2's 64 slots of 64 KiB): its 48 blocks are stored,
# and loaded by its second run, a share at a time (KV_ESHARE, then the
# rest after a COMMIT or a RELEASE), as a connector would; none refused.
"$BIN/kvcached" --socket-dir "$T/run3" --g2-capacity 4M --set g2.page_size=4M --set g2.lock=no \
  --g3-path "" 2>"$T/log3" &
pid3=$!
PIDS+=("$pid3")
wait_for "$T/log3" "ready:" 10 || bad "third kvcached ready: $(cat "$T/log3")"
ids=$(seq -s, 1001 1048)
for ts in 0 1; do
  echo "{\"timestamp\": $ts, \"input_length\": 24576, \"output_length\": 1, \"hash_ids\": [$ids]}"
done >"$T/long.jsonl"
expect_exit 0 "replay of a request of 48 blocks, twice, into 64 slots" \
  "$KVB" replay --trace "$T/long.jsonl" --socket-dir "$T/run3" --json --time-scale 0 --block-bytes 64K
check "stored whole and loaded whole, a share at a time" \
  num '.blocks.committed == 48 and .blocks.refused == 0 and .blocks.hit == 48 and .blocks.load_failed == 0 and .blocks.share_rounds == 2 and .verify_failures == 0'
grep -q "may allocate no more" "$T/log3" && ok "the daemon said why it refused" ||
  bad "no share warning: $(cat "$T/log3")"
# --store-batch 16: the same request's blocks are allocated and committed
# 16 at a time (as an engine storing each step's blocks), so no store
# reaches the share; its second run still loads it a share at a time.
ids=$(seq -s, 2001 2048)
for ts in 0 1; do
  echo "{\"timestamp\": $ts, \"input_length\": 24576, \"output_length\": 1, \"hash_ids\": [$ids]}"
done >"$T/long2.jsonl"
expect_exit 0 "the same with --store-batch 16" \
  "$KVB" replay --trace "$T/long2.jsonl" --socket-dir "$T/run3" --json --time-scale 0 --block-bytes 64K \
  --store-batch 16
check "stored 16 at a time: no store round for the share, one load round" \
  num '.store_batch == 16 and .blocks.committed == 48 and .blocks.refused == 0 and .blocks.hit == 48 and .blocks.share_rounds == 1'
kill -TERM "$pid3"
wait "$pid3"

# A wrong block under the key of a trace block (the first block of
# request 0, stored with zeros through the inline path): served, but not
# the bytes of that block: a verify failure, and exit status 1.
if command -v b2sum >/dev/null; then
  id=$(head -1 "$TRACE" | jq '.hash_ids[0]')
  key=$( { printf 'kvcached-chain-v1'; head -c 36 /dev/zero
           printf "$(printf '\\x%02x' $(for s in 0 8 16 24 32 40 48 56; do echo $(( (id >> s) & 255 )); done))"; } |
         b2sum -l 256 | cut -c1-64)
  "$BIN/kvcached" --socket-dir "$T/run2" --g2-capacity 16M --set g2.page_size=4M --set g2.lock=no \
    --g3-path "" 2>"$T/log2" &
  pid2=$!
  PIDS+=("$pid2")
  wait_for "$T/log2" "ready:" 10 || bad "second kvcached ready: $(cat "$T/log2")"
  expect_exit 0 "a zero block stored under the first key" "$BIN/kvctl" put "$key" --value x \
    --socket-dir "$T/run2" --tenant kvbench --block-bytes 64K --tokens-per-block 512 --layers 1 \
    --kv-heads 1 --head-dim 1
  expect_exit 1 "replay of request 0 fails" "$KVB" replay --trace "$TRACE" --socket-dir "$T/run2" --json --time-scale 0 --limit 1
  check "the wrong block is a verify failure, not a hit" num '.verify_failures == 1 and .blocks.hit == 0'
  grep -q "not theirs" "$T/err" && ok "and says so" || bad "verify-failure message: $(cat "$T/err")"
  kill -TERM "$pid2"
  wait "$pid2"
else
  echo "# b2sum not found: the wrong-block check is not run"
fi

kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached stopped cleanly" || bad "kvcached exit status $rc"
finish
