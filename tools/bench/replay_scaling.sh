#!/usr/bin/env bash
# replay_scaling.sh - `kvbench replay` of the Mooncake trace with 1, 2, 4
# and 8 client processes, each count against a fresh kvcached (G2 of the
# given size, G3 off unless -G), REPS runs each; prints a markdown table of
# the medians: requests/s, LOOKUP and LOAD p50/p99 (microseconds), the
# prefix (token) and block hit rates. Requests are replayed without their
# timestamps (-x 0) unless -x gives a time scale.
#
# usage: tools/bench/replay_scaling.sh [-b BIN_DIR] [-g G2_SIZE] [-G G3_SIZE] [-d DIR]
#            [-c "1 2 4 8"] [-l LIMIT] [-B BLOCK_BYTES] [-x TIME_SCALE] [-r REPS]
#            [-w ALLOC_WAIT_MS] [-t TRACE]
#   G2_SIZE     G2 capacity of each daemon (default 1G: about a third of the
#               trace's 43,924 unique blocks of 64 KiB)
#   G3_SIZE     G3 capacity, in DIR (default 0: no G3)
#   LIMIT       the first LIMIT requests (default: all 3,993)
#   BLOCK_BYTES bytes per 512-token block (default 64K)
#   REPS        runs per client count; medians shown (default 1)
# Needs jq. About 10 s per run on a 2-core VM with the defaults.
set -u
prog=replay_scaling
source "$(dirname "$0")/lib.sh"

bindir="" g2=1G g3=0 dir="" counts="1 2 4 8" limit="" block=64K scale=0 reps=1 wait_ms=0
trace=$bench_root/bench/traces/mooncake_synthetic_trace.jsonl
while getopts "b:g:G:d:c:l:B:x:r:w:t:h" o; do
  case $o in
    b) bindir=$OPTARG ;; g) g2=$OPTARG ;; G) g3=$OPTARG ;; d) dir=$OPTARG ;; c) counts=$OPTARG ;;
    l) limit=$OPTARG ;; B) block=$OPTARG ;; x) scale=$OPTARG ;; r) reps=$OPTARG ;;
    w) wait_ms=$OPTARG ;; t) trace=$OPTARG ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need jq
[ -r "$trace" ] || die "no trace at $trace (-t TRACE)"
bench_tmp
[ -n "$dir" ] || dir=$T

g3args=(--g3-path "")
[ "$g3" != 0 ] && g3args=(--g3-path "$dir/g3-scaling" --g3-capacity "$g3")
echo "kvbench replay of $(basename "$trace")${limit:+ (first $limit requests)}: blocks of $block, G2 $g2, G3 ${g3/#0/off}, time scale $scale, alloc wait ${wait_ms} ms, median of $reps"
echo
echo "| clients | requests/s | LOOKUP p50 µs | LOOKUP p99 µs | LOAD p50 µs | LOAD p99 µs | prefix hit rate | block hit rate | G3 hits | stores refused |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for c in $counts; do
  declare -A v=()
  for r in $(seq "$reps"); do
    rm -rf "$dir/g3-scaling"
    start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity "$g2" --set g2.lock=no "${g3args[@]}"
    "$bin/kvbench" replay --trace "$trace" --socket-dir "$T/run" --json --clients "$c" \
      --block-bytes "$block" --time-scale "$scale" --alloc-wait-ms "$wait_ms" ${limit:+--limit "$limit"} \
      >"$T/replay.json" 2>"$T/replay.err" || die "replay with $c clients failed: $(tail -3 "$T/replay.err")"
    stop_pid "$kpid"
    for f in requests_per_s lookup_us.p50 lookup_us.p99 load_us.p50 load_us.p99 prefix_hit_rate \
             block_hit_rate hits.g3 blocks.refused; do
      v[$f]="${v[$f]:-} $(jq ".$f" "$T/replay.json")"
    done
  done
  printf "| %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.4f | %.4f | %d | %d |\n" "$c" \
    "$(echo "${v[requests_per_s]}" | median)" "$(echo "${v[lookup_us.p50]}" | median)" \
    "$(echo "${v[lookup_us.p99]}" | median)" "$(echo "${v[load_us.p50]}" | median)" \
    "$(echo "${v[load_us.p99]}" | median)" "$(echo "${v[prefix_hit_rate]}" | median)" \
    "$(echo "${v[block_hit_rate]}" | median)" "$(echo "${v[hits.g3]}" | median)" \
    "$(echo "${v[blocks.refused]}" | median)"
  unset v
done
