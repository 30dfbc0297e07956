#!/usr/bin/env bash
# g4_bench.sh - G4 (the Redis Cluster tier, tiers/G4.md) through the daemon,
# beside Redis's own figures on the same cluster in the same run. Starts a
# throwaway cluster (tests/lib/redis_cluster.sh: 3 masters, 3 replicas, on
# loopback) and kvcached daemons pointed at it; everything is stopped at the
# end. Prints two markdown tables.
#
# 1. Bandwidth, per block size: `redis-benchmark --cluster` SET and GET of
#    values of that size (the reference), against kvcached node A storing N
#    blocks (kvbench replay; every block is written to G4 when committed:
#    g4.admit always) and node B, a fresh daemon, replaying the same
#    requests: each LOOKUP finds the blocks in G4 only, brings them into G2
#    verified, and LOAD reads them. Store: the blocks' bytes over the time
#    from the replay's start until G4 acknowledged the last write; load: the
#    bytes node B read over its replay's time. Both through one client and
#    one connection per node (the reference: -c clients, -P pipeline).
#    Beside each: the daemon's loop turns meanwhile (kvcached_loop_turn_
#    seconds, daemon/OPS.md: the time callbacks held its event loop, which
#    every request waits behind), p99 and the longest, in ms (the upper
#    bounds of their histogram buckets).
#    The references are SET of new keys (what the daemon does: every block
#    it stores is new to the cluster), SET over a small keyspace (Redis
#    overwriting values, faster: their memory is reused) and GET (see the
#    comment in part 1). Each daemon runs as deployed: G2 locked in memory
#    (g2.lock = yes), so its pages are in place before the clock starts.
# 2. Cross-node hit rate: the agentic trace's requests dealt between two
#    nodes, by session (even and odd session numbers: a session stays on
#    its node) and by request (alternating: a session's next request lands
#    on the other node, as without session affinity or after a hand-off);
#    with -e, every M-th session only. Each node's G2 at a share of its
#    half's unique blocks, G3 off, both replaying at once at the trace's
#    times scaled; once with each node on its own (G4 off), once with G4
#    but each node under key names of its own (the cluster's room, nothing
#    shared), once sharing it. Prefix hit % per node and both (weighted by
#    blocks referenced).
#
# usage: tools/bench/g4_bench.sh [-b BIN_DIR] [-s "64K 256K 1M"] [-m MIB]
#            [-c CLIENTS] [-P PIPELINE] [-t TRACE] [-e M] [-x SCALE] [-f SHARE]
#            [-B BLOCK] [-1 | -2]
#   -s  block sizes of part 1 (default 64K 256K 1M)
#   -m  MiB stored per size in part 1 (default 256)
#   -c, -P  redis-benchmark's clients and pipeline depth (default 1 and 16: one
#       connection per node and 16 commands in flight, as one replayed request
#       of 16 blocks has through the daemon)
#   -t  trace of part 2 (default bench/traces/agentic_sessions_dev.jsonl.gz)
#   -e  every M-th session (default 1: all of them)
#   -x  time scale of part 2 (default 0.001)
#   -f  each node's G2 as a share of its half's unique blocks (default 0.05)
#   -B  block bytes of part 2 (default 4K: the hit rate does not depend on it)
#   -1, -2  part 1 only, part 2 only
# Needs redis-server, redis-cli, redis-benchmark, jq, curl.
set -u
prog=g4_bench
source "$(dirname "$0")/lib.sh"

bindir="" sizes="64K 256K 1M" mib=256 clients=1 pipe=16 trace="" every=1 scale=0.001 share=0.05
block2=4K parts="1 2"
while getopts "b:s:m:c:P:t:e:x:f:B:12h" o; do
  case $o in
    b) bindir=$OPTARG ;; s) sizes=$OPTARG ;; m) mib=$OPTARG ;; c) clients=$OPTARG ;;
    P) pipe=$OPTARG ;; t) trace=$OPTARG ;; e) every=$OPTARG ;; x) scale=$OPTARG ;;
    f) share=$OPTARG ;; B) block2=$OPTARG ;; 1) parts=1 ;; 2) parts=2 ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need jq curl redis-server redis-cli redis-benchmark
bench_tmp
cluster=$bench_root/tests/lib/redis_cluster.sh
cdir=$T/cluster
mkdir -p "$cdir"
trap 'bash "$cluster" stop "$cdir" >/dev/null 2>&1; bench_cleanup' EXIT
bash "$cluster" start "$cdir" --masters 3 --replicas 1 --owner $$ >"$T/cluster.out" ||
  die "no cluster: $(cat "$T/cluster.out")"
mapfile -t ports <"$cdir/ports"
seeds="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
# the fleet's secret every node signs and verifies G4 values with (mode 0600)
(umask 077 && head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$T/g4.key")
flush() { local p; for p in "${ports[@]:0:3}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done; }

# node NAME G2_BYTES G4(on|own|off): a kvcached with its own socket
# directory; own: G4 under key names of its own (g4.prefix), so the nodes
# share the cluster but not their blocks
node() {
  local name=$1 g2=$2 g4=$3 args=()
  [ "$g4" != off ] && args=(--set "g4.seeds=$seeds" --set g4.timeout_ms=1000
    --set "g4.key_file=$T/g4.key")
  [ "$g4" = own ] && args+=(--set "g4.prefix=kv$name:")
  mkdir -p "$T/$name"
  start_kvcached "$T/$name.log" --socket-dir "$T/$name" --g2-capacity "$g2" --set g2.page_size=4M \
    --set g2.lock=yes --g3-path "" "${args[@]}"
  eval "pid_$name=$kpid"
}
metric() { # metric NAME SELECTOR: a value from node NAME's /metrics
  curl -sf --unix-socket "$T/$1/kvcached-stats.sock" http://localhost/metrics |
    awk -v m="$2" '$1 == m { print $2 }'
}
# turns NAME: node NAME's loop-turn histogram (kvcached_loop_turn_seconds),
# "le count" per bucket, cumulative
turns() {
  curl -sf --unix-socket "$T/$1/kvcached-stats.sock" http://localhost/metrics |
    sed -n 's/^kvcached_loop_turn_seconds_bucket{loop="main",le="\([^"]*\)"} \(.*\)$/\1 \2/p'
}
# turns_between BEFORE AFTER: the turns taken meanwhile, "p99 max" in ms
# (the upper bounds of the buckets holding them)
turns_between() {
  paste -d' ' "$1" "$2" | awk '{ le[NR] = $1; d[NR] = $4 - $2 } END {
    n = d[NR]; p = "-"; m = "-"
    for (i = 1; i <= NR; i++) {
      if (p == "-" && d[i] >= 0.99 * n) p = le[i]
      if (m == "-" && d[i] >= n) m = le[i]
    }
    f = "%.3g"
    printf (p == "+Inf" ? "%s" : f) " " (m == "+Inf" ? "%s" : f) "\n",
      p == "+Inf" ? p : p * 1000, m == "+Inf" ? m : m * 1000
  }'
}
# rb_rps N CMD...: requests per second of redis-benchmark run as CMD (N
# requests), from its process's wall time. In cluster mode it notices its
# end on a quarter-second timer (1024 GETs of 256 KiB and 3000 take the
# same 0.26 s), so its runs are made long, seconds, for that to matter
# little: the bias is against the reference (a slower Redis, a ratio
# higher by up to 0.25 s over the run's time).
rb_rps() {
  local nreq=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { echo 0; return; }
  t1=$(date +%s.%N)
  awk -v n="$nreq" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }'
}
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.3f", b / s / 1e9; else print "-" }'; }

machine "$T"
echo "- cluster: 3 masters + 3 replicas on loopback, redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
echo

if [[ " $parts " == *" 1 "* ]]; then
  echo "| block | redis-benchmark SET new keys GB/s | SET over GB/s | kvcached store to G4 GB/s | ratio to SET new | A's loop turns p99 / max ms | redis-benchmark GET GB/s | kvcached load from G4 GB/s | ratio | B's loop turns p99 / max ms | blocks from G4 |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for s in $sizes; do
    sb=$(bytes_of "$s")
    n=$((mib * 1048576 / sb))
    per=16
    reqs=$(((n + per - 1) / per))
    n=$((reqs * per))
    # requests of 16 blocks each, every block new (ids per request)
    awk -v r="$reqs" -v p="$per" 'BEGIN { for (i = 0; i < r; i++) { s = ""; for (j = 0; j < p; j++) s = s (j ? "," : "") (i * p + j + 1); printf "{\"timestamp\":%d,\"input_length\":%d,\"output_length\":1,\"hash_ids\":[%s]}\n", i, p * 512, s } }' >"$T/bw.jsonl"
    flush
    # The references. SET: 8n SETs into the emptied cluster, each of a
    # key not there yet (random among 10^12), as each block node A stores
    # is new: Redis allocates (and its replicas copy) new values, as it
    # does for the daemon. Beside it, SET over: 32n SETs over a keyspace
    # of n/4 keys (each written about 128 times: after the first, Redis
    # reuses the memory of the value it replaces, which makes it faster
    # than storing new values). GET: 32n GETs over those n/4 keys; a GET
    # of a key no SET reached would return nil, so GET's bytes are counted
    # for the keys that exist only.
    space=$((n / 4 > 0 ? n / 4 : 1))
    rb=(redis-benchmark --cluster -h 127.0.0.1 -p "${ports[0]}" -d "$sb" -c "$clients" -P "$pipe"
      --csv)
    new_rps=$(rb_rps $((8 * n)) "${rb[@]}" -n $((8 * n)) -r 1000000000000 -t set)
    flush
    rb+=(-n $((32 * n)) -r "$space")
    set_rps=$(rb_rps $((32 * n)) "${rb[@]}" -t set)
    have=0
    for p in "${ports[@]:0:3}"; do have=$((have + $(redis-cli -p "$p" DBSIZE))); done
    get_rps=$(rb_rps $((32 * n)) "${rb[@]}" -t get)
    set_gbps=$(awk -v r="$set_rps" -v b="$sb" 'BEGIN { printf "%.3f", r * b / 1e9 }')
    new_gbps=$(awk -v r="$new_rps" -v b="$sb" 'BEGIN { printf "%.3f", r * b / 1e9 }')
    get_gbps=$(awk -v r="$get_rps" -v b="$sb" -v h="$have" -v k="$space" \
      'BEGIN { f = h / k; if (f > 1) f = 1; printf "%.3f", r * b * f / 1e9 }')
    flush
    g2=$(((n * sb * 5 / 4 + 4194303) / 4194304 * 4194304))
    node a "$g2" on
    turns a >"$T/turns0"
    t0=$(date +%s.%N)
    "$bin/kvbench" replay --trace "$T/bw.jsonl" --socket-dir "$T/a" --json --block-bytes "$s" \
      --no-timestamps >"$T/a.json" 2>"$T/a.err" || die "replay on A: $(tail -3 "$T/a.err")"
    for _ in $(seq 600); do
      ok=$(metric a 'kvcached_g4_writes_total{result="ok"}')
      [ "${ok:-0}" -ge "$n" ] && break
      inflight=$(metric a kvcached_g4_commands_in_flight)
      [ "${inflight:-1}" = 0 ] && break
      sleep 0.05
    done
    t1=$(date +%s.%N)
    ok=$(metric a 'kvcached_g4_writes_total{result="ok"}')
    [ "${ok:-0}" -ge "$n" ] || echo "# $s: G4 acknowledged ${ok:-0} of $n writes" >&2
    store_gbps=$(gbps "$(( ${ok:-0} * sb ))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
    turns a >"$T/turns1"
    read -r store_p99 store_max < <(turns_between "$T/turns0" "$T/turns1")
    node b "$g2" on
    turns b >"$T/turns0"
    "$bin/kvbench" replay --trace "$T/bw.jsonl" --socket-dir "$T/b" --json --block-bytes "$s" \
      --no-timestamps >"$T/b.json" 2>"$T/b.err" || die "replay on B: $(tail -3 "$T/b.err")"
    g4hits=$(metric b kvcached_g4_hits_total)
    turns b >"$T/turns1"
    read -r load_p99 load_max < <(turns_between "$T/turns0" "$T/turns1")
    load_gbps=$(gbps "$(jq '.bytes.client_read' "$T/b.json")" "$(jq '.elapsed_s' "$T/b.json")")
    [ "$(jq '.verify_failures' "$T/b.json")" = 0 ] || die "$s: node B read wrong bytes"
    stop_pid "$pid_a"
    stop_pid "$pid_b"
    printf "| %s | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s / %s | %s of %s |\n" "$s" \
      "$new_gbps" "$set_gbps" "$store_gbps" "$(ratio "$store_gbps" "$new_gbps")" "$store_p99" \
      "$store_max" "$get_gbps" "$load_gbps" "$(ratio "$load_gbps" "$get_gbps")" "$load_p99" \
      "$load_max" "${g4hits:-0}" "$n"
  done
  echo
fi

if [[ " $parts " == *" 2 "* ]]; then
  if [ -z "$trace" ]; then
    trace=$bench_root/bench/traces/agentic_sessions_dev.jsonl.gz
  fi
  [ -r "$trace" ] || die "no trace at $trace (-t TRACE)"
  { case $trace in *.gz) zcat "$trace" ;; *) cat "$trace" ;; esac; } |
    jq -c "select((.session // 0) % $every == 0)" >"$T/all.jsonl"
  bb=$(bytes_of "$block2")
  # deal session: a session's requests all go to one node (even and odd
  # session numbers); deal request: requests alternate between the nodes
  # (no session affinity: a session's next request finds its prefix on the
  # other node, as after a prefill node hands off to a decode node)
  for deal in session request; do
    if [ $deal = session ]; then
      jq -c "select(((.session // 0) / $every | floor) % 2 == 0)" "$T/all.jsonl" >"$T/half_a.jsonl"
      jq -c "select(((.session // 0) / $every | floor) % 2 == 1)" "$T/all.jsonl" >"$T/half_b.jsonl"
    else
      awk 'NR % 2 == 1' "$T/all.jsonl" >"$T/half_a.jsonl"
      awk 'NR % 2 == 0' "$T/all.jsonl" >"$T/half_b.jsonl"
    fi
    declare -A g2of
    for h in a b; do
      u=$(jq -c '.hash_ids[]' "$T/half_$h.jsonl" | sort -u | wc -l)
      blocks=$(awk -v u="$u" -v f="$share" 'BEGIN { printf "%d", u * f }')
      g2of[$h]=$(((blocks * bb + 4095) / 4096 * 4096))
      echo "# dealt by $deal: node $h: $(wc -l <"$T/half_$h.jsonl") requests, $u unique blocks, G2 $blocks blocks"
    done
    echo
    echo "| dealt by | G4 | node A prefix hit % | node B prefix hit % | both | blocks from G4 (A + B) |"
    echo "|---|---|---|---|---|---|"
    for g4 in off own on; do
      flush
      node a "${g2of[a]}" "$g4"
      node b "${g2of[b]}" "$g4"
      for h in a b; do
        "$bin/kvbench" replay --trace "$T/half_$h.jsonl" --socket-dir "$T/$h" --json \
          --block-bytes "$block2" --time-scale "$scale" >"$T/r_$h.json" 2>"$T/r_$h.err" &
        eval "rp_$h=$!"
      done
      wait "$rp_a" || die "replay on A: $(tail -3 "$T/r_a.err")"
      wait "$rp_b" || die "replay on B: $(tail -3 "$T/r_b.err")"
      ga=$(metric a kvcached_g4_hits_total) gb=$(metric b kvcached_g4_hits_total)
      stop_pid "$pid_a"
      stop_pid "$pid_b"
      both=$(jq -s '(map(.prefix_hit_rate * .blocks.referenced) | add) / (map(.blocks.referenced) | add) * 100' \
        "$T/r_a.json" "$T/r_b.json")
      printf "| %s | %s | %.2f | %.2f | %.2f | %s |\n" "$deal" "$g4" "$(jq '.prefix_hit_rate * 100' "$T/r_a.json")" \
        "$(jq '.prefix_hit_rate * 100' "$T/r_b.json")" "$both" "$(( ${ga:-0} + ${gb:-0} ))"
    done
    echo
    unset g2of
  done
fi
