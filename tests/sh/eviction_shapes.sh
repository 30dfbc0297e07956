#!/usr/bin/env bash
# eviction_shapes.sh - the default eviction policy on workloads that try to
# break it (tools/tracegen.py: short-reuse chat, a long-tail Zipf, shifting
# popularity, scans, loops, mixed tenants, sessions with think time),
# replayed through the core at 1-50% of each trace's unique blocks
# (tools/bench/eviction.py --check): at no shape and capacity more than 0.3
# points (prefix token hit %) below plain LRU, nor more than 0.5 below the
# better of the two orders it moves between (`aged0`: H = 0, LRU's order;
# `aged`: H = 4 capacities, the default before H moved). And the check has
# teeth: `aged` fails it on the chat shape.
source "$(dirname "$0")/lib.bash"

py=${KV_PYTHON3:-python3}
command -v "$py" >/dev/null || { echo "no python3: skipped"; exit 77; }
eviction="$SRC/tools/bench/eviction.py"

expect_exit 0 "tracegen lists seven shapes" "$py" "$SRC/tools/tracegen.py" --list
check "chat zipf shift scan loop tenants sessions" test "$(sort "$T/out" | tr '\n' ' ')" = \
  "chat loop scan sessions shift tenants zipf "
"$py" "$SRC/tools/tracegen.py" chat --scale 0.05 -o "$T/a.jsonl"
"$py" "$SRC/tools/tracegen.py" chat --scale 0.05 -o "$T/b.jsonl"
check "the same shape and seed give the same bytes" cmp -s "$T/a.jsonl" "$T/b.jsonl"
"$py" "$SRC/tools/tracegen.py" chat --scale 0.05 --seed 2 -o "$T/c.jsonl"
check "another seed, another trace" test "$(cmp -s "$T/a.jsonl" "$T/c.jsonl"; echo $?)" = 1
expect_exit 0 "a generated trace replays" "$BIN/kvbench" core-replay --trace "$T/a.jsonl" --json
check "with Belady's MIN at each capacity, above the policy" \
  test "$(jq '[.results[] | .belady_prefix_token_hit_rate >= .prefix_token_hit_rate] | all' "$T/out")" = true

"$py" "$eviction" --kvbench "$BIN/kvbench" --check --json "$T/shapes.json" >"$T/report" 2>&1
rc=$?
cat "$T/report"
check "the default within bounds on every shape and capacity" test "$rc" = 0
check "seven shapes at six capacities" test "$(jq '[.[] | .rows.adapt | length] == [6,6,6,6,6,6,6]' "$T/shapes.json")" = true

"$py" "$eviction" --kvbench "$BIN/kvbench" --shapes chat --default aged --candidates aged0 \
  --others "" --check >"$T/aged" 2>&1
rc=$?
grep '^FAIL' "$T/aged" | sed 's/^/# /'
check "aged (the fixed bonus) fails the check on the chat shape" test "$rc" = 1
finish
