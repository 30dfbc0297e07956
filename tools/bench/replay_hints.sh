#!/usr/bin/env bash
# replay_hints.sh - engine hints through the daemon: `kvbench replay` of a
# trace with sessions (the agentic trace by default) against a fresh
# kvcached per run, each policy without and with --hints (the trace's
# sessions on stores, its stop reasons once each request is done: what an
# API server knows then). One client, requests in trace order, no waiting
# (-x 0: the daemon's clock is the replay's, so the gaps it learns are the
# replay's). G3 off: the G2 capacity is the cache. Prints a markdown table of
# the prefix (token) hit rates.
#
# usage: tools/bench/replay_hints.sh [-b BIN_DIR] [-t TRACE] [-l LIMIT] [-B BLOCK_BYTES]
#            [-f "0.05 0.10"] [-p "lru adapt"]
#   LIMIT        the first LIMIT requests (default 4000: 88,087 unique blocks
#                of the agentic trace)
#   BLOCK_BYTES  bytes per 512-token block (default 4K: the hit rate does not
#                depend on it; small blocks keep the run short)
#   -f           G2 capacities, as shares of the unique blocks of the replayed
#                requests (default 0.05 0.10)
#   -p           eviction policies (default: lru adapt)
# Needs jq and python3 (to count the unique blocks). About 2 minutes per
# run on a 2-core VM with the defaults.
set -u
prog=replay_hints
source "$(dirname "$0")/lib.sh"

bindir="" limit=4000 block=4K fracs="0.05 0.10" policies="lru adapt" trace=""
while getopts "b:t:l:B:f:p:h" o; do
  case $o in
    b) bindir=$OPTARG ;; t) trace=$OPTARG ;; l) limit=$OPTARG ;; B) block=$OPTARG ;;
    f) fracs=$OPTARG ;; p) policies=$OPTARG ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need jq
bench_tmp
if [ -z "$trace" ]; then
  gz=$bench_root/../shared/data/agentic_sessions_dev.jsonl.gz
  [ -r "$gz" ] || die "no trace at $gz (-t TRACE)"
  zcat "$gz" | head -n "$limit" >"$T/trace.jsonl"
  trace=$T/trace.jsonl
fi
[ -r "$trace" ] || die "no trace at $trace"
unique=$(head -n "$limit" "$trace" | jq -c '.hash_ids[]' | sort -u | wc -l)
bb=$(jq -n "\"$block\" | if test(\"[Kk]$\") then (.[:-1] | tonumber) * 1024 elif test(\"[Mm]$\") then (.[:-1] | tonumber) * 1048576 else tonumber end")

echo "kvbench replay of $(basename "$trace") (first $limit requests, $unique unique blocks): blocks of $block, G3 off, 1 client, no waiting"
echo
echo "| policy | G2 (share of unique blocks) | prefix hit % without hints | with hints | hints sent | hinted keys not there |"
echo "|---|---|---|---|---|---|"
for p in $policies; do
  for f in $fracs; do
    blocks=$(awk -v u="$unique" -v f="$f" 'BEGIN { printf "%d", u * f }')
    g2=$(( (blocks * bb + 4095) / 4096 * 4096 ))
    declare -A v=()
    for h in off on; do
      start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity "$g2" --set g2.page_size=4M \
        --set g2.lock=no --g3-path "" --policy "$p"
      args=()
      [ "$h" = on ] && args=(--hints)
      "$bin/kvbench" replay --trace "$trace" --socket-dir "$T/run" --json --block-bytes "$block" \
        --time-scale 0 --limit "$limit" "${args[@]}" >"$T/replay.json" 2>"$T/replay.err" ||
        die "replay ($p, $f, hints $h) failed: $(tail -3 "$T/replay.err")"
      stop_pid "$kpid"
      v[$h]=$(jq '.prefix_hit_rate * 100' "$T/replay.json")
      v[sent]=$(jq '.hints.sent' "$T/replay.json")
      v[unmatched]=$(jq '.hints.keys_unmatched' "$T/replay.json")
    done
    printf "| %s | %s (%d blocks) | %.2f | %.2f | %d | %d |\n" "$p" "$f" "$blocks" "${v[off]}" "${v[on]}" \
      "${v[sent]}" "${v[unmatched]}"
    unset v
  done
done
