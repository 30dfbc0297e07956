#!/usr/bin/env bash
# two_tiers_as_one.sh - G2 + G3 as one cache under the default policy: the
# same trace replayed through the core with one tier, and with G2 and a
# real G3 (io_uring, O_DIRECT) holding the same total split 1:10
# (`kvbench core-replay --g3-dir --tiers-only`), at no capacity more than
# 0.3 points of prefix hit % under the one tier. The agentic trace at 1%
# and 2% (0.38 and 0.15 under before G2 ranked by recency alone, in front
# of G3: tiers/EVICTION.md, "G2 as the lead's window") and the Mooncake
# trace at its six capacities. SSD completions arrive in the device's
# order, which moves a figure by about 0.1 point between runs.
source "$(dirname "$0")/lib.bash"

# G3 on tmpfs where there is one: about 3 times faster than on a disk.
G3R=$T
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  G3R=$(mktemp -d /dev/shm/kvtest-g3.XXXXXX)
  trap 'rm -rf "$G3R"; cleanup' EXIT
fi

# replay NAME TRACE [--capacity F ...]: one run, its JSON in $T/NAME.json
replay() {
  local name=$1 trace=$2
  shift 2
  mkdir -p "$G3R/$name"
  expect_exit 0 "$name: one tier and two tiers replayed" "$BIN/kvbench" core-replay \
    --trace "$trace" --policy adapt --g3-dir "$G3R/$name" --tiers-only --json "$@"
  cp "$T/out" "$T/$name.json"
  jq -r 'def pct: . * 10000 | round / 100;
    .tiers.adapt[] | "# \(.capacity_fraction * 100)%:"
    + " one tier \(.single_tier.prefix_hit_rate | pct)%, two \(.g2_g3.prefix_hit_rate | pct)%,"
    + " difference \(.difference_points * 100 | round / 100) points"' "$T/$name.json"
}

# within NAME N: the replay has N capacities, none more than 0.3 under
within() {
  check "$1: $2 capacities, two tiers at most 0.3 points under one tier at each" test \
    "$(jq --argjson n "$2" '[.tiers.adapt[] | .difference_points >= -0.3] as $ok
       | ($ok | length) == $n and ($ok | all)' "$T/$1.json")" = true
}

zcat "$SRC/bench/traces/agentic_sessions_dev.jsonl.gz" >"$T/agentic.jsonl"
replay agentic "$T/agentic.jsonl" --capacity 0.01 --capacity 0.02
within agentic 2
replay mooncake "$SRC/bench/traces/mooncake_synthetic_trace.jsonl"
within mooncake 6
check "the split is the bench's, 1:10" test \
  "$(jq '[.tiers.adapt[] | .g3_ratio == 10] | all' "$T/mooncake.json")" = true
finish
