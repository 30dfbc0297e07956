#!/usr/bin/env bash
# daemon_vs_refs.sh - kvcached's data path against two references, in one
# run on one machine: plain memcpy of the same blocks (the ceiling), and
# Redis over a Unix socket (the usual way a KV cache is served from host
# memory by another process). It starts its own kvcached and its own
# redis-server (both on Unix sockets in a temporary directory; the daemon
# with G3 off) and stops them at the end, whatever happens.
#
#   memcpy     kvbench memcpy: copy each 256 KiB block of a 512 MiB working set
#              out of a shared mapping (no daemon)
#   Redis GET  redis-benchmark -t get over the socket, on 512 MiB of 256 KiB
#   Redis SET  values put in first (same keys and size); GB/s = req/s x 262144
#   G2 load    kvbench load: LOAD 32 blocks, copy each out verified
#              (kvc_read: the copy and its CRC check in one pass), RELEASE
#              (two LOADs in flight)
#   G2 store   kvbench store: ALLOC 32 blocks, copy each in while
#              checksumming it (kvc_copy_crc), COMMIT with the CRCs (two
#              ALLOCs in flight, COMMITs not waited for)
#   lookup     kvbench lookup: batched LOOKUPs of 1024 keys, and single-key
#              round trips
# Each figure is the median of REPS runs. Targets: G2 load / Redis GET >= 2,
# G2 load / memcpy >= 0.6, G2 store / memcpy >= 0.6, batched lookups >= 2 M
# keys/s, single lookup p50 <= 20 us.
#
# usage: tools/bench/daemon_vs_refs.sh [-b BIN_DIR] [-g G2_SIZE] [-s SECONDS]
#            [-r REPS] [-c "1 2"] [-n REDIS_REQUESTS]
#   BIN_DIR         where kvcached and kvbench are (default: build/bin, else
#                   build-tools/bin)
#   G2_SIZE         G2 capacity of the daemon (default 2G; must hold twice
#                   the 512 MiB working set)
#   SECONDS         timed part of each kvbench run (default 2)
#   REPS            runs of each measurement; the median is shown (default 3)
#   clients         client counts to measure (default "1 2")
#   REDIS_REQUESTS  requests per redis-benchmark run (default 10000)
# Needs redis-server, redis-benchmark, redis-cli and jq (deploy/install-deps.sh).
set -u
prog=daemon_vs_refs
source "$(dirname "$0")/lib.sh"

bindir="" g2=2G secs=2 reps=3 clients="1 2" rreq=10000
while getopts "b:g:s:r:c:n:h" o; do
  case $o in
    b) bindir=$OPTARG ;; g) g2=$OPTARG ;; s) secs=$OPTARG ;; r) reps=$OPTARG ;;
    c) clients=$OPTARG ;; n) rreq=$OPTARG ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need redis-server redis-benchmark redis-cli jq

BLOCK=262144
SET_BYTES=$((512 << 20))
NBLK=$((SET_BYTES / BLOCK))
bench_tmp
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = (op == ">=") ? v + 0 >= t : v + 0 <= t; print ok ? "met" : "MISSED" }'; }

# --- the daemon and Redis ------------------------------------------------------------
# G3 off: this compares the G2 data path (and keeps the run off any disk).
start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity "$g2" --g3-path ""
start_redis "$T/redis.sock"
# Redis gets the same working set: NBLK values of 256 KiB.
fill_redis "$T/redis.sock" "$NBLK" "$BLOCK"
[ "$(redis-cli -s "$T/redis.sock" strlen key:000000000007)" = "$BLOCK" ] || die "Redis values are not $BLOCK bytes"


cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
echo "kvcached vs references: ${BLOCK}-byte blocks, working set $((SET_BYTES >> 20)) MiB, median of $reps runs"
echo "machine: ${cpu:-unknown CPU}, $(nproc) cores; $(grep -o 'G2 [0-9]* bytes.*' "$T/kvcached.log" | head -1)"
echo "redis: $(redis-server --version | awk '{ print $3 }'), redis-benchmark -s SOCK -t get|set -d $BLOCK -r $NBLK -n $rreq -P 1 -c C [--threads C]"
echo

# The runs of one client count go round the measurements REPS times (memcpy,
# load, store, ... then again), so that a change in what else the machine
# runs weighs on a ratio's both sides alike.
declare -A R V
for c in $clients; do
  for _ in $(seq "$reps"); do
    for name in memcpy load store get set; do
      case $name in
        memcpy) v=$(kv memcpy gbps --seconds "$secs" --block-bytes "$BLOCK" --blocks "$NBLK" --clients "$c") ;;
        load) v=$(kv load gbps --seconds "$secs" --socket-dir "$T/run" --block-bytes "$BLOCK" --blocks "$NBLK" --clients "$c") ;;
        store) v=$(kv store gbps --seconds "$secs" --socket-dir "$T/run" --block-bytes "$BLOCK" --clients "$c") ;;
        get|set) v=$(redis_gbps "$T/redis.sock" "$name" "$BLOCK" "$NBLK" "$rreq" "$c") ;;
      esac
      [ -n "$v" ] || die "$name with $c client(s) failed: $(tail -3 "$T/kvbench.err")"
      V[$name,$c]="${V[$name,$c]:-} $v"
    done
  done
  for name in memcpy load store get set; do R[$name,$c]=$(echo "${V[$name,$c]}" | median); done
done
kv_vals="" p50_vals="" p99_vals=""
for _ in $(seq "$reps"); do
  # the daemon's LOOKUP (a worker would answer these from its presence table)
  KVCACHED_LOOKUP=daemon "$bin/kvbench" lookup --json --seconds "$secs" --socket-dir "$T/run" \
    --block-bytes "$BLOCK" \
    >"$T/lookup.json" 2>>"$T/kvbench.err" || die "lookup failed: $(tail -3 "$T/kvbench.err")"
  kv_vals="$kv_vals $(jq .keys_per_s "$T/lookup.json")"
  p50_vals="$p50_vals $(jq .rtt_p50_us "$T/lookup.json")"
  p99_vals="$p99_vals $(jq .rtt_p99_us "$T/lookup.json")"
done
keys_s=$(echo "$kv_vals" | median)
p50=$(echo "$p50_vals" | median)
p99=$(echo "$p99_vals" | median)

row() { # row LABEL KEY
  printf "%-28s" "$1"
  for c in $clients; do printf " %12.3f" "${R[$2,$c]}"; done
  echo
}
ratio_row() { # ratio_row LABEL NUM DEN TARGET_OP TARGET
  printf "%-28s" "$1"
  local worst=""
  for c in $clients; do
    r=$(ratio "${R[$2,$c]}" "${R[$3,$c]}")
    printf " %12s" "$r"
    if [ -n "$4" ] && [ "$(verdict "$r" "$4" "$5")" = MISSED ]; then worst=MISSED; fi
  done
  [ -n "$4" ] && printf "   target %s %s: %s" "$4" "$5" "${worst:-met}"
  echo
}
printf "%-28s" "GB/s (1e9 B/s), clients:"
for c in $clients; do printf " %12s" "$c"; done
echo
row "memcpy" memcpy
row "Redis GET" get
row "Redis SET" set
row "G2 load (LOAD+copy out)" load
row "G2 store (ALLOC+copy+COMMIT)" store
echo
ratio_row "G2 load / Redis GET" load get ">=" 2
ratio_row "G2 load / memcpy" load memcpy ">=" 0.6
ratio_row "G2 store / memcpy" store memcpy ">=" 0.6
ratio_row "G2 store / Redis SET" store set "" ""
echo
printf "%-28s %12.0f   target >= 2000000: %s\n" "batched lookup keys/s" "$keys_s" "$(verdict "$keys_s" ">=" 2000000)"
printf "%-28s %12.1f   target <= 20: %s\n" "single lookup p50 us" "$p50" "$(verdict "$p50" "<=" 20)"
printf "%-28s %12.1f\n" "single lookup p99 us" "$p99"
