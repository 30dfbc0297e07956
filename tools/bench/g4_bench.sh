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
#    bytes node B read over its replay's time. Both with C replaying
#    clients (kvbench --clients, each one request of 16 blocks at a time)
#    and one connection per node; the reference with C connections
#    (redis-benchmark -c: it deals them over the masters) of 16 commands
#    in flight each (-P), its rate counted by the masters over a window.
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
#            [-c CLIENTS] [-P PIPELINE] [-w SECONDS] [-r ROUNDS] [-t TRACE] [-e M]
#            [-x SCALE] [-f SHARE] [-B BLOCK] [-G] [-1 | -2]
#   -s  block sizes of part 1 (default 64K 256K 1M)
#   -m  MiB stored per size in part 1 (default 256)
#   -c  clients of part 1: redis-benchmark's connections and kvbench's
#       replaying clients (default 3: one per master)
#   -P  redis-benchmark's pipeline depth (default 16: the commands in flight
#       of one replayed request of 16 blocks through the daemon)
#   -w  seconds each reference is counted over (default 2)
#   -r  rounds of part 1 per block size, each the references and the daemons
#       in turn; the table has their medians (default 3)
#   -t  trace of part 2 (default bench/traces/agentic_sessions_dev.jsonl.gz)
#   -e  every M-th session (default 1: all of them)
#   -x  time scale of part 2 (default 0.001)
#   -f  each node's G2 as a share of its half's unique blocks (default 0.05)
#   -B  block bytes of part 2 (default 4K: the hit rate does not depend on it)
#   -G  part 1's node A stores with COMMITs answered once the blocks are in
#       G4 (kvbench replay --shared), as a prefill node handing its prompts
#       to decode nodes does; default: plain COMMITs (written behind them)
#   -1, -2  part 1 only, part 2 only
# Needs redis-server, redis-cli, redis-benchmark, jq, curl.
set -u
prog=g4_bench
source "$(dirname "$0")/lib.sh"

bindir="" sizes="64K 256K 1M" mib=256 clients=3 pipe=16 window=2 rounds=3
trace="" every=1 scale=0.001 share=0.05
block2=4K parts="1 2" shared=()
while getopts "b:s:m:c:P:w:r:t:e:x:f:B:G12h" o; do
  case $o in
    b) bindir=$OPTARG ;; s) sizes=$OPTARG ;; m) mib=$OPTARG ;; c) clients=$OPTARG ;;
    P) pipe=$OPTARG ;; w) window=$OPTARG ;; r) rounds=$OPTARG ;; t) trace=$OPTARG ;;
    e) every=$OPTARG ;; x) scale=$OPTARG ;;
    f) share=$OPTARG ;; B) block2=$OPTARG ;; G) shared=(--shared) ;; 1) parts=1 ;; 2) parts=2 ;;
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
rpids=()
for p in "${ports[@]}"; do rpids+=("$(cat "$cdir/$p/redis.pid")"); done
seeds="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
# the fleet's secret every node signs and verifies G4 values with (mode 0600)
(umask 077 && head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$T/g4.key")
# flush: the cluster emptied, and every node's allocator made to give back
# the memory it kept (MEMORY PURGE), so that each measurement finds the
# nodes as the first did: storing new values takes fresh pages
flush() {
  local p
  for p in "${ports[@]:0:3}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
  sleep 0.2 # the replicas follow
  for p in "${ports[@]}"; do redis-cli -p "$p" MEMORY PURGE >/dev/null; done
}

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
# counted CMD: what the cluster's masters counted so far: "set" their SET
# calls (INFO commandstats), "hits" their keyspace hits (GETs that found
# their key)
counted() {
  local c=0 p v
  for p in "${ports[@]:0:3}"; do
    if [ "$1" = hits ]; then
      v=$(redis-cli -p "$p" INFO stats | tr -d '\r' | sed -n 's/^keyspace_hits:\([0-9]*\)$/\1/p')
    else
      v=$(redis-cli -p "$p" INFO commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$1:calls=\([0-9]*\),.*/\1/p")
    fi
    c=$((c + ${v:-0}))
  done
  echo "$c"
}
# rb_rate WHAT CMD...: redis-benchmark run as CMD, looping (-l); after half
# a second of warming up, the commands per second the masters counted
# (counted WHAT) over the next $window seconds, and the CPU time of the
# cluster's redis-servers (masters and replicas) per command meanwhile, in
# microseconds; then it is stopped. Timed
# at the servers, over a window: redis-benchmark's own rate is not used,
# since in cluster mode it notices its end on a quarter-second timer
# (1024 and 3000 GETs of 256 KiB both take 0.26 s), which made a run's
# rate low by up to a quarter second over its time.
rb_rate() {
  local what=$1 pid c0 c1 t0 t1 r0 r1
  shift
  "$@" -l >/dev/null 2>&1 &
  pid=$!
  sleep 0.5
  c0=$(counted "$what") t0=$(date +%s.%N) r0=$(cpu_ns "${rpids[@]}")
  sleep "$window"
  c1=$(counted "$what") t1=$(date +%s.%N) r1=$(cpu_ns "${rpids[@]}")
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  awk -v a="$c0" -v b="$c1" -v s="$t0" -v e="$t1" -v r0="$r0" -v r1="$r1" \
    'BEGIN { printf "%.1f %.0f\n", (b - a) / (e - s), (b > a ? (r1 - r0) / (b - a) / 1000 : 0) }'
}
# cpu_ns PID...: the CPU time of every thread of those processes so far, in ns
cpu_ns() {
  local p
  for p; do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done |
    awk '{ s += $1 } END { printf "%.0f\n", s }'
}
# per_us NS0 NS1 N: (NS1 - NS0) / N in microseconds
per_us() {
  awk -v a="$1" -v b="$2" -v n="$3" \
    'BEGIN { if (n > 0) printf "%.0f", (b - a) / n / 1000; else print "-" }'
}
# client CMD...: CMD run (kvbench), its CPU time and its children's (the
# replaying workers) in ns written to $T/client_ns; CMD's status
client() {
  (
    "$@"
    s=$?
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.0f\n", ($16 + $17) * 1e9 / hz }' \
      /proc/$BASHPID/stat >"$T/client_ns"
    exit $s
  )
}
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.3f", b / s / 1e9; else print "-" }'; }

machine "$T"
echo "- cluster: 3 masters + 3 replicas on loopback, redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
echo

if [[ " $parts " == *" 1 "* ]]; then
  echo "| block | redis-benchmark SET new keys GB/s | SET over GB/s | kvcached store to G4 GB/s | ratio to SET new | A's loop turns p99 / max ms | redis-benchmark GET GB/s | kvcached load from G4 GB/s | ratio | B's loop turns p99 / max ms | blocks from G4 |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  cpu_rows=()
  for s in $sizes; do
    sb=$(bytes_of "$s")
    n=$((mib * 1048576 / sb))
    per=16
    reqs=$(((n + per - 1) / per))
    n=$((reqs * per))
    # requests of 16 blocks each, every block new (ids per request)
    awk -v r="$reqs" -v p="$per" 'BEGIN { for (i = 0; i < r; i++) { s = ""; for (j = 0; j < p; j++) s = s (j ? "," : "") (i * p + j + 1); printf "{\"timestamp\":%d,\"input_length\":%d,\"output_length\":1,\"hash_ids\":[%s]}\n", i, p * 512, s } }' >"$T/bw.jsonl"
    # The references, each redis-benchmark looping for $window seconds
    # (rb_rate). SET new: SETs into the emptied cluster, each of a key not
    # there yet (random among 2*10^9: redis-benchmark reads -r as an int),
    # as each block node A stores is new: Redis allocates (and its replicas
    # copy) new values, as it does for the daemon. Beside it, SET over:
    # SETs over a keyspace of n/4 keys per master (after the first, Redis
    # reuses the memory of the value it replaces, which makes it faster
    # than storing new values). GET: GETs over those keys, counted by the
    # masters' keyspace hits (a GET of a key no SET reached returns nil,
    # and is not counted).
    space=$((n / 4 > 0 ? n / 4 : 1))
    rb=(redis-benchmark --cluster -h 127.0.0.1 -p "${ports[0]}" -d "$sb" -c "$clients" -P "$pipe")
    g2=$(((n * sb * 5 / 4 + 4194303) / 4194304 * 4194304))
    if [ -z "${warmed:-}" ]; then
      # A fresh cluster stores its first values slower (the first window
      # of SET new on the development VM: 0.3-0.4 GB/s at 256 KiB, later
      # ones 0.9-1.1): one window, not counted, before any measurement.
      flush
      rb_rate set "${rb[@]}" -r 2000000000 -t set >/dev/null
      warmed=1
    fi
    vals=()
    for ((round = 1; round <= rounds; round++)); do
      # Each round: SET new, then node A's store and node B's load of it,
      # then SET over and GET; each from an emptied cluster (flush).
      flush
      read -r new_rps new_cpu < <(rb_rate set "${rb[@]}" -r 2000000000 -t set)
      flush
      node a "$g2" on
      turns a >"$T/turns0"
      r0=$(cpu_ns "${rpids[@]}") d0=$(cpu_ns "$pid_a")
      t0=$(date +%s.%N)
      client "$bin/kvbench" replay --trace "$T/bw.jsonl" --socket-dir "$T/a" --json --block-bytes "$s" \
        --no-timestamps --clients "$clients" "${shared[@]}" >"$T/a.json" 2>"$T/a.err" ||
        die "replay on A: $(tail -3 "$T/a.err")"
      for _ in $(seq 600); do
        ok=$(metric a 'kvcached_g4_writes_total{result="ok"}')
        [ "${ok:-0}" -ge "$n" ] && break
        inflight=$(metric a kvcached_g4_commands_in_flight)
        [ "${inflight:-1}" = 0 ] && break
        sleep 0.05
      done
      t1=$(date +%s.%N)
      r1=$(cpu_ns "${rpids[@]}") d1=$(cpu_ns "$pid_a")
      store_cpu="$(per_us "$r0" "$r1" "$n") $(per_us "$d0" "$d1" "$n")"
      store_cpu+=" $(per_us 0 "$(cat "$T/client_ns")" "$n")"
      ok=$(metric a 'kvcached_g4_writes_total{result="ok"}')
      [ "${ok:-0}" -ge "$n" ] || echo "# $s: G4 acknowledged ${ok:-0} of $n writes" >&2
      store_gbps=$(gbps "$(( ${ok:-0} * sb ))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
      turns a >"$T/turns1"
      read -r store_p99 store_max < <(turns_between "$T/turns0" "$T/turns1")
      node b "$g2" on
      turns b >"$T/turns0"
      r0=$(cpu_ns "${rpids[@]}") d0=$(cpu_ns "$pid_b")
      client "$bin/kvbench" replay --trace "$T/bw.jsonl" --socket-dir "$T/b" --json --block-bytes "$s" \
        --no-timestamps --clients "$clients" >"$T/b.json" 2>"$T/b.err" ||
        die "replay on B: $(tail -3 "$T/b.err")"
      r1=$(cpu_ns "${rpids[@]}") d1=$(cpu_ns "$pid_b")
      load_cpu="$(per_us "$r0" "$r1" "$n") $(per_us "$d0" "$d1" "$n")"
      load_cpu+=" $(per_us 0 "$(cat "$T/client_ns")" "$n")"
      g4hits=$(metric b kvcached_g4_hits_total)
      turns b >"$T/turns1"
      read -r load_p99 load_max < <(turns_between "$T/turns0" "$T/turns1")
      load_gbps=$(gbps "$(jq '.bytes.client_read' "$T/b.json")" "$(jq '.elapsed_s' "$T/b.json")")
      [ "$(jq '.verify_failures' "$T/b.json")" = 0 ] || die "$s: node B read wrong bytes"
      stop_pid "$pid_a"
      stop_pid "$pid_b"
      flush
      rb_rate set "${rb[@]}" -r "$space" -t set >/dev/null # the keys GET reads
      read -r set_rps _ < <(rb_rate set "${rb[@]}" -r "$space" -t set)
      read -r get_rps get_cpu < <(rb_rate hits "${rb[@]}" -r "$space" -t get)
      new_gbps=$(awk -v r="$new_rps" -v b="$sb" 'BEGIN { printf "%.3f", r * b / 1e9 }')
      set_gbps=$(awk -v r="$set_rps" -v b="$sb" 'BEGIN { printf "%.3f", r * b / 1e9 }')
      get_gbps=$(awk -v r="$get_rps" -v b="$sb" 'BEGIN { printf "%.3f", r * b / 1e9 }')
      # one line per round: the figures, and the ratios of this round's
      vals+=("$new_gbps $set_gbps $store_gbps $(ratio "$store_gbps" "$new_gbps") $store_p99 \
$store_max $get_gbps $load_gbps $(ratio "$load_gbps" "$get_gbps") $load_p99 $load_max \
${g4hits:-0} $new_cpu $store_cpu $get_cpu $load_cpu")
      [ "$rounds" -gt 1 ] && echo "# $s round $round: ${vals[-1]}" >&2
    done
    # medians over the rounds; the ratios are the medians of each round's
    # (the daemon beside the reference it ran next to); loop turns and
    # blocks from G4: the worst round's
    col() { local i=$1; printf '%s\n' "${vals[@]}" | awk -v i="$i" '{ printf "%s ", $i }'; }
    worst() { col "$1" | tr ' ' '\n' | grep -v '^$' | sort -g | tail -1; }
    least() { col "$1" | tr ' ' '\n' | grep -v '^$' | sort -g | head -1; }
    printf "| %s | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s / %s | %s of %s |\n" "$s" \
      "$(col 1 | median)" "$(col 2 | median)" "$(col 3 | median)" "$(col 4 | median)" \
      "$(worst 5)" "$(worst 6)" "$(col 7 | median)" "$(col 8 | median)" "$(col 9 | median)" \
      "$(worst 10)" "$(worst 11)" "$(least 12)" "$n"
    row="| $s |"
    for i in 13 14 15 16 17 18 19 20; do row+=" $(col $i | median) |"; done
    cpu_rows+=("$row")
  done
  # CPU per block (the processes' threads, from /proc: schedstat for the
  # servers and the daemon, the client's and its workers' times), medians
  # over the rounds: what each side of the path costs the machine's cores
  echo
  echo "CPU per block, µs (medians over the rounds): the redis-servers (masters and" \
    "replicas) per command of redis-benchmark, and per block through node A (store) and" \
    "node B (load): the redis-servers, the daemon's threads, the replaying client"
  echo
  echo "| block | SET new: redis | store: redis | daemon | client | GET: redis | load: redis | daemon | client |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${cpu_rows[@]}"
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
