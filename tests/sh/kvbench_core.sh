#!/usr/bin/env bash
# kvbench_core.sh - `kvbench core-replay`: its JSON shape, the promise that
# the default policy's prefix hit rate is never below plain LRU's measured
# in the same run, and clear errors for bad traces; `kvbench scale`: its
# JSON and the 128-byte metadata budget per block at 10^4 and 10^5 blocks.
source "$(dirname "$0")/lib.bash"

trace=$(mooncake_trace)

expect_exit 0 "core-replay runs" "$BIN/kvbench" core-replay --trace "$trace" --json
cp "$T/out" "$T/result.json"
check "one JSON object with six capacities" test "$(jq '.results | length' "$T/result.json")" = 6
check "fractions are 1,2,5,10,20,50%" test "$(jq -c '[.results[].capacity_fraction]' "$T/result.json")" = "[0.01,0.02,0.05,0.1,0.2,0.5]"
check "lookup rate measured" test "$(jq '.index_lookups_per_s > 0' "$T/result.json")" = true
check "every capacity at least plain LRU's prefix hit rate" \
  test "$(jq '[.results[] | .prefix_hit_rate >= .reference_lru.prefix_hit_rate - 1e-9] | all' "$T/result.json")" = true
check "block hit rate never below prefix hit rate" \
  test "$(jq '[.results[] | .block_hit_rate >= .prefix_hit_rate] | all' "$T/result.json")" = true
echo "# $(jq -c '[.results[] | {f: .capacity_fraction, ours: .prefix_hit_rate, lru: .reference_lru.prefix_hit_rate}]' "$T/result.json")"
echo "# index lookups/s: $(jq .index_lookups_per_s "$T/result.json")"

expect_exit 0 "all policies compared in one run" "$BIN/kvbench" core-replay --trace "$trace" --policy all --json
check "by_policy lists every policy" test "$(jq '.by_policy | length' "$T/out")" = "$("$BIN/kvctl" policies | wc -l)"
check "arc, s3fifo and tinylfu replayed at six capacities" \
  test "$(jq '[.by_policy.arc, .by_policy.s3fifo, .by_policy.tinylfu | length] == [6,6,6]' "$T/out")" = true
check "auto at or above plain LRU at every capacity" \
  test "$(jq '[.by_policy.auto[] | .prefix_hit_rate >= .reference_lru.prefix_hit_rate - 1e-9] | all' "$T/out")" = true

# A gzip trace is read as the plain one (the tree's agentic trace is gzip);
# a damaged one is refused with a reason.
head -n 400 "$trace" > "$T/plain.jsonl"
gzip -c "$T/plain.jsonl" > "$T/plain.jsonl.gz"
expect_exit 0 "core-replay of a plain trace" "$BIN/kvbench" core-replay --trace "$T/plain.jsonl" --json
jq -c '[.requests, .unique_blocks, [.results[].prefix_hit_rate]]' "$T/out" > "$T/plain.res"
expect_exit 0 "core-replay of the same trace gzipped" "$BIN/kvbench" core-replay --trace "$T/plain.jsonl.gz" --json
jq -c '[.requests, .unique_blocks, [.results[].prefix_hit_rate]]' "$T/out" > "$T/gz.res"
check "the same requests, blocks and hit rates" cmp -s "$T/plain.res" "$T/gz.res"
# --store-batch: a request's new blocks stored N at a time (ALLOC N, then
# their COMMITs), as `kvbench replay --store-batch` stores them through the
# daemon; one at a time is the default replay's order, so the same figures.
expect_exit 0 "core-replay --store-batch 1" "$BIN/kvbench" core-replay --trace "$T/plain.jsonl" \
  --store-batch 1 --json
jq -c '[.requests, .unique_blocks, [.results[].prefix_hit_rate]]' "$T/out" > "$T/b1.res"
check "--store-batch 1 gives the default replay's hit rates" cmp -s "$T/plain.res" "$T/b1.res"
check "and says so" test "$(jq .store_batch "$T/out")" = 1
expect_exit 0 "core-replay --store-batch 16 --hints" "$BIN/kvbench" core-replay \
  --trace "$T/plain.jsonl" --store-batch 16 --hints --json
expect_exit 2 "--store-batch wants a count" "$BIN/kvbench" core-replay --trace "$T/plain.jsonl" \
  --store-batch many
head -c "$(($(stat -c %s "$T/plain.jsonl.gz") / 2))" "$T/plain.jsonl.gz" > "$T/cut.jsonl.gz"
expect_exit 1 "a cut gzip trace is refused" "$BIN/kvbench" core-replay --trace "$T/cut.jsonl.gz" --json

# G2 + G3 with a real SSD tier, once per admission policy (a small trace:
# the full one writes ~100k blocks and takes minutes).
head -n 300 "$trace" > "$T/small.jsonl"
mkdir -p "$T/g3"
expect_exit 0 "core-replay with a G3 tier runs" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --json
check "three admission policies reported" test "$(jq '.admission | length' "$T/out")" = 3
check "each with a hit rate and SSD writes" test "$(jq '[.admission[] | has("prefix_hit_rate") and has("g3_writes")] | all' "$T/out")" = true
check "blocks come back from G3, every one verified (its real checksum)" \
  test "$(jq '[.admission[] | .g3_promotions > 0 and .g3_promote_failed == 0] | all' "$T/out")" = true
check "second-use writes no more than always" test "$(jq '.admission[0].g3_writes >= .admission[1].g3_writes' "$T/out")" = true
check "one policy: no per-policy G3 table" test "$(jq 'has("g3_by_policy")' "$T/out")" = false
# G2 + G3 beside a single tier of the same total, at each capacity (issue 19 item 6).
check "G2 + G3 beside one tier at each capacity whose G3 share is 64 blocks or more" \
  test "$(jq '(.tiers[.policy] | length) == ([.results[] | select(.capacity_blocks - (.capacity_blocks / 11 + 0.5 | floor) >= 64)] | length) and (.tiers[.policy] | length) > 2' "$T/out")" = true
check "the two tiers split the capacity 1:10" \
  test "$(jq '[.tiers[.policy][] | (.g2_g3.g2_blocks + .g2_g3.g3_blocks == .capacity_blocks) and (.g2_g3.g3_blocks >= 9 * .g2_g3.g2_blocks)] | all' "$T/out")" = true
check "each with both hit rates and their difference in points" \
  test "$(jq '[.tiers[.policy][] | .difference_points - 100 * (.g2_g3.prefix_hit_rate - .single_tier.prefix_hit_rate) | . * . < 1e-8] | all' "$T/out")" = true
check "and what G3 read back verified" \
  test "$(jq '[.tiers[.policy][] | .g2_g3.g3_promotions > 0 and .g2_g3.g3_promote_failed == 0] | all' "$T/out")" = true
echo "# G2+G3 vs one tier: $(jq -c '[.tiers[.policy][] | {f: .capacity_fraction, one: .single_tier.prefix_hit_rate, two: .g2_g3.prefix_hit_rate}]' "$T/out")"
expect_exit 0 "--tiers-only" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --g3-ratio 4 --tiers-only --json
check "--tiers-only: the side-by-side table alone" test "$(jq 'has("tiers") and (has("admission") | not)' "$T/out")" = true
check "--g3-ratio 4 splits 1:4" test "$(jq '.tiers[.policy][3] | .g2_g3.g3_blocks - 4 * .g2_g3.g2_blocks | . * . <= 25' "$T/out")" = true
expect_exit 0 "--capacity: only the capacities asked for" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --tiers-only --capacity 0.5 --capacity 0.2 --json
check "--capacity 0.5 0.2: those two, in that order, in both tables" \
  test "$(jq -c '[.results[].capacity_fraction, .tiers[.policy][].capacity_fraction]' "$T/out")" = "[0.5,0.2,0.5,0.2]"
expect_exit 0 "--victims: each replay's victims, in order" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --tiers-only --capacity 0.2 --victims "$T/v" --json
check "--victims: one line per eviction of the single tier" \
  test "$(wc -l <"$T/v.one")" -eq "$(jq '.results[0].evictions' "$T/out")"
check "--victims: G2 + G3's victims too, as REQUEST KEY USED_AGAIN" \
  test "$(grep -cvE '^[0-9]+ [0-9a-f]+ [01]$' "$T/v.two")" -eq 0 -a -s "$T/v.two"
expect_exit 0 "victims_diff.py reads them" python3 "$SRC/tools/bench/victims_diff.py" "$T/v"
expect_exit 2 "--victims without --tiers-only is a usage error" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --capacity 0.2 --victims "$T/v"
expect_exit 2 "--capacity 0 is a usage error" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --capacity 0
expect_exit 2 "--g3-ratio 0 is a usage error" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --g3-ratio 0
expect_exit 0 "core-replay with a G3 tier, every policy" "$BIN/kvbench" core-replay --trace "$T/small.jsonl" --g3-dir "$T/g3" --policy all --json
check "G3 replayed once per policy" test "$(jq '.g3_by_policy | length' "$T/out")" = "$("$BIN/kvctl" policies | wc -l)"
check "each policy with a hit rate, hits from G3 and SSD writes" \
  test "$(jq '[.g3_by_policy[] | has("prefix_hit_rate") and has("prefix_hits_from_g3") and .g3_writes > 0] | all' "$T/out")" = true

# Scale: the index and the default policy at 10^4 and 10^5 blocks.
expect_exit 0 "scale runs to 10^5 blocks" "$BIN/kvbench" scale --max 100000 --json
cp "$T/out" "$T/scale.json"
check "scale measured at 10^4 and 10^5 blocks" test "$(jq -c '[.sizes[].blocks]' "$T/scale.json")" = "[10000,100000]"
check "scale reports bytes, lookup latency and inserts at each size" \
  test "$(jq '[.sizes[] | (.bytes_per_block > 0) and (.hit_ns_p50 > 0) and (.hit_ns_p99 >= .hit_ns_p50) and (.miss_ns_p50 > 0) and (.miss_ns_p99 >= .miss_ns_p50) and (.inserts_per_s > 0)] | all' "$T/scale.json")" = true
check "at most 128 bytes of metadata per block at each size" \
  test "$(jq '([.sizes[] | .bytes_per_block <= 128] | all) and .meets_target' "$T/scale.json")" = true
check "the bytes include the records" \
  test "$(jq '.record_bytes as $r | [.sizes[] | .index_bytes_per_block >= $r] | all' "$T/scale.json")" = true
echo "# scale: $(jq -c '[.sizes[] | {n: .blocks, B: .bytes_per_block, hit50: .hit_ns_p50, miss50: .miss_ns_p50}]' "$T/scale.json")"
expect_exit 2 "scale --max 0 is a usage error" "$BIN/kvbench" scale --max 0

printf '{"timestamp": 0, "input_length": 10, "hash_ids": [1, 2]}\nnot json\n' > "$T/bad.jsonl"
expect_exit 1 "a malformed trace is refused" "$BIN/kvbench" core-replay --trace "$T/bad.jsonl"
grep -q "bad.jsonl:2" "$T/err" && ok "the error names the line" || bad "the error names the line: $(cat "$T/err")"
expect_exit 1 "a missing trace is refused" "$BIN/kvbench" core-replay --trace "$T/none.jsonl"
expect_exit 2 "no --trace is a usage error" "$BIN/kvbench" core-replay
expect_exit 2 "unknown policy is a usage error" "$BIN/kvbench" core-replay --trace "$trace" --policy nope
expect_exit 2 "unknown subcommand is a usage error" "$BIN/kvbench" frob
finish
