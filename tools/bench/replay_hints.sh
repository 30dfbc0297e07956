#!/usr/bin/env bash
# replay_hints.sh - engine hints through the daemon: `kvbench replay` of a
# trace with sessions (the agentic trace by default) against a fresh
# kvcached per run, each policy without and with --hints (the trace's
# sessions on loads and stores, its stop reasons once each request is done: what an
# API server knows then). One client, requests in trace order, at their
# timestamps scaled by -x (the daemon's clock is the wall clock, so the gaps
# it learns are the trace's, scaled). G3 off: the G2 capacity is the cache.
# `lru` ignores hints: it runs without them only. Prints a markdown table of
# the prefix (token) hit rates.
#
# usage: tools/bench/replay_hints.sh [-b BIN_DIR] [-t TRACE] [-s M] [-l LIMIT] [-x SCALE]
#            [-B BLOCK_BYTES] [-f "0.05 0.10"] [-p "lru adapt"] [-n N] [-o DIR]
#   M            the sessions whose number is a multiple of M (default 12: 38
#                sessions, 2,858 requests of the agentic trace; whole
#                sessions, so the cache sees each one's life)
#   LIMIT        at most LIMIT of their requests (default: all)
#   SCALE        time scale (default 0.001: the 26 hours of the agentic trace
#                in 95 s). The hints read the sessions' gaps off the daemon's
#                wall clock, where the replay's own time counts 1/SCALE times:
#                at 0.001 a request falls minutes of the trace's time behind
#                and the hints gain nothing; -l 1500 -x 0.03 keeps up (the
#                "late s" column) in about 105 s per run (tiers/EVICTION.md)
#   BLOCK_BYTES  bytes per 512-token block (default 4K: the hit rate does not
#                depend on it; small blocks keep the run short)
#   -f           G2 capacities, as shares of the unique blocks of the replayed
#                requests (default 0.05 0.10)
#   -p           eviction policies (default: lru adapt)
#   -n N         kvbench replay --store-batch N: a request's new blocks are
#                allocated and committed N at a time (default 0: all at once)
#   -o DIR       keep each run's `kvbench replay --json` output in DIR, as
#                POLICY_G2_hintsoff.json and POLICY_G2_hintson.json (elapsed_s, late_s_max, counts)
# Needs jq. About 100 s per run with the defaults (the trace's time, scaled).
set -u
prog=replay_hints
source "$(dirname "$0")/lib.sh"

bindir="" limit=1000000000 block=4K fracs="0.05 0.10" policies="lru adapt" trace="" every=12 scale=0.001
batch=0 keep=""
while getopts "b:t:s:l:x:B:f:p:n:o:h" o; do
  case $o in
    b) bindir=$OPTARG ;; t) trace=$OPTARG ;; s) every=$OPTARG ;; l) limit=$OPTARG ;;
    x) scale=$OPTARG ;; B) block=$OPTARG ;; f) fracs=$OPTARG ;; p) policies=$OPTARG ;;
    n) batch=$OPTARG ;; o) keep=$OPTARG ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need jq
bench_tmp
if [ -z "$trace" ]; then
  gz=$bench_root/bench/traces/agentic_sessions_dev.jsonl.gz
  [ -r "$gz" ] || die "no trace at $gz (-t TRACE)"
  trace=$gz
fi
[ -r "$trace" ] || die "no trace at $trace"
{ case $trace in *.gz) zcat "$trace" ;; *) cat "$trace" ;; esac; } |
  jq -c "select((.session // 0) % $every == 0)" | head -n "$limit" >"$T/trace.jsonl"
nreq=$(wc -l <"$T/trace.jsonl")
unique=$(jq -c '.hash_ids[]' "$T/trace.jsonl" | sort -u | wc -l)
bb=$(bytes_of "$block")

echo "kvbench replay of $(basename "$trace"), sessions that are multiples of $every ($nreq requests, $unique unique blocks): blocks of $block, G3 off, 1 client, time scale $scale"
echo "store batch: $batch (kvbench replay --store-batch; 0: a request's new blocks in one ALLOC)"
echo "late: the most a request of the last run (with hints, but for lru) started behind its" \
  "time, in the trace's seconds (wall seconds / SCALE)"
echo
echo "| policy | G2 (share of unique blocks) | prefix hit % without hints | with hints |" \
  "hints sent | hinted keys not there | late s |"
echo "|---|---|---|---|---|---|---|"
for p in $policies; do
  for f in $fracs; do
    blocks=$(awk -v u="$unique" -v f="$f" 'BEGIN { printf "%d", u * f }')
    g2=$(( (blocks * bb + 4095) / 4096 * 4096 ))
    declare -A v=()
    hs="off on"
    [ "$p" = lru ] && hs=off
    v[on]=-1 v[sent]=0 v[unmatched]=0 v[late]=0
    for h in $hs; do
      start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity "$g2" --set g2.page_size=4M \
        --set g2.lock=no --g3-path "" --policy "$p"
      args=()
      [ "$h" = on ] && args=(--hints)
      "$bin/kvbench" replay --trace "$T/trace.jsonl" --socket-dir "$T/run" --json --block-bytes "$block" \
        --time-scale "$scale" --store-batch "$batch" "${args[@]}" >"$T/replay.json" \
        2>"$T/replay.err" ||
        die "replay ($p, $f, hints $h) failed: $(tail -3 "$T/replay.err")"
      stop_pid "$kpid"
      [ -n "$keep" ] && cp "$T/replay.json" "$keep/${p}_${f}_hints${h}.json"
      v[$h]=$(jq '.prefix_hit_rate * 100' "$T/replay.json")
      v[late]=$(jq ".late_s_max / $scale" "$T/replay.json")
      if [ "$h" = on ]; then
        v[sent]=$(jq '.hints.sent' "$T/replay.json")
        v[unmatched]=$(jq '.hints.keys_unmatched' "$T/replay.json")
      fi
    done
    on="n/a (lru ignores hints)"
    [ "${v[on]}" != -1 ] && on=$(printf "%.2f" "${v[on]}")
    printf "| %s | %s (%d blocks) | %.2f | %s | %d | %d | %.0f |\n" "$p" "$f" "$blocks" \
      "${v[off]}" "$on" "${v[sent]}" "${v[unmatched]}" "${v[late]}"
    awk -v l="${v[late]}" 'BEGIN { exit !(l > 10) }' && slow=1
    unset v
  done
done
if [ -n "${slow:-}" ]; then
  echo
  echo "The replay fell behind the trace by more than 10 s of its time: the daemon's clock (the"
  echo "wall clock) then holds the replay's own processing, which the hints read as the sessions'"
  echo "gaps; a larger -x (with -l to keep the run short) gives hints what the core replay gives"
  echo "(tiers/EVICTION.md, \"Through the daemon\", 2026-11-29)."
fi
