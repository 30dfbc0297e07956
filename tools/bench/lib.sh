# lib.sh - what the benchmark scripts of tools/bench share (sourced, not
# run): finding the binaries, a temporary directory whose servers are
# stopped on exit, starting kvcached and redis-server on Unix sockets,
# one fio or redis-benchmark run as GB/s, medians and ratios, and the
# machine's description. A script sets `prog` (its name, for messages)
# before sourcing it.

bench_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH_PIDS=()

die() { echo "$prog: $*" >&2; exit 1; }
# need TOOL...: each on PATH, else exit 2 saying where it comes from.
need() {
  local t
  for t; do command -v "$t" >/dev/null || { echo "$prog: $t not found (deploy/install-deps.sh)" >&2; exit 2; }; done
}
# find_bin [DIR]: prints the bin directory that has kvcached and kvbench:
# DIR, else build/bin, else build-tools/bin; exit 2 if none.
find_bin() {
  local c
  for c in ${1:+"$1"} "$bench_root/build/bin" "$bench_root/build-tools/bin"; do
    if [ -x "$c/kvcached" ] && [ -x "$c/kvbench" ]; then (cd "$c" && pwd); return 0; fi
    [ -n "${1:-}" ] && break
  done
  echo "$prog: no kvcached/kvbench in ${1:-build/bin or build-tools/bin} (build first, or -b BIN_DIR)" >&2
  exit 2
}
# bench_tmp: T = a new temporary directory, removed (and every server
# started here stopped) when the script exits.
bench_tmp() {
  T=$(mktemp -d "${TMPDIR:-/tmp}/kvbench.XXXXXX")
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
}
bench_cleanup() {
  local p
  for p in "${BENCH_PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
  for p in "${BENCH_PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
# start_kvcached LOG ARGS...: starts $bin/kvcached ARGS (log to LOG), waits
# until it is ready; its pid in kpid.
start_kvcached() {
  local log=$1
  shift
  "$bin/kvcached" --log-level info "$@" 2>"$log" &
  kpid=$!
  BENCH_PIDS+=("$kpid")
  for _ in $(seq 100); do grep -qs "ready:" "$log" && return 0; sleep 0.1; done
  die "kvcached did not start: $(cat "$log")"
}
# stop_pid PID: SIGTERM, and wait for it.
stop_pid() {
  local i
  kill -TERM "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  for i in "${!BENCH_PIDS[@]}"; do [ "${BENCH_PIDS[$i]}" = "$1" ] && unset "BENCH_PIDS[$i]"; done
  return 0
}
# start_redis SOCK: a redis-server on Unix socket SOCK only (no TCP, no
# persistence), files in $T; its pid in rpid.
start_redis() {
  redis-server --port 0 --unixsocket "$1" --unixsocketperm 700 --save '' \
    --appendonly no --dir "$T" --logfile "$T/redis.log" &
  rpid=$!
  BENCH_PIDS+=("$rpid")
  for _ in $(seq 100); do redis-cli -s "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "redis-server did not start: $(cat "$T/redis.log")"
}
# fill_redis SOCK N BYTES: N values of BYTES bytes under the keys
# redis-benchmark -r N asks for (key:%012d).
fill_redis() {
  local sock=$1 n=$2 bytes=$3 i k
  head -c "$bytes" /dev/zero | tr '\0' 'x' >"$T/value"
  for ((i = 0; i < n; i++)); do
    k=$(printf 'key:%012d' "$i")
    printf '*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n' "${#k}" "$k" "$bytes"
    cat "$T/value"
    printf '\r\n'
  done | redis-cli -s "$sock" --pipe >"$T/pipe.out" 2>&1 || die "filling Redis: $(cat "$T/pipe.out")"
  [ "$(redis-cli -s "$sock" dbsize)" = "$n" ] || die "Redis holds $(redis-cli -s "$sock" dbsize) keys, not $n"
}
# redis_gbps SOCK get|set BYTES N REQUESTS CLIENTS: one redis-benchmark
# run on N keys of BYTES, in GB/s (1e9 B/s).
redis_gbps() {
  local threads=()
  [ "$6" -gt 1 ] && threads=(--threads "$6")
  redis-benchmark -s "$1" -t "$2" -d "$3" -r "$4" -n "$5" -P 1 -c "$6" "${threads[@]}" --csv 2>/dev/null |
    awk -F'"' -v t="$(echo "$2" | tr a-z A-Z)" -v b="$3" '$2 == t { printf "%.4f", $4 * b / 1e9 }'
}
# redis_p50_us SOCK: round trip of a PING (one client, no pipelining),
# p50 in microseconds.
redis_p50_us() {
  redis-benchmark -s "$1" -t ping_mbulk -n 20000 -P 1 -c 1 --csv 2>/dev/null |
    awk -F'"' '$2 == "PING_MBULK" { printf "%.1f", $10 * 1000 }'
}
# bytes_of 256K -> 262144
bytes_of() {
  local v=${1%[KkMmGg]} u=${1: -1}
  case $u in K|k) echo $((v << 10)) ;; M|m) echo $((v << 20)) ;; G|g) echo $((v << 30)) ;; *) echo "$1" ;; esac
}
# fio_gbps FILE SIZE_MIB write|read BS QD: one fio run (io_uring, O_DIRECT,
# sequential) in GB/s.
fio_gbps() {
  local out
  out=$(fio --name=kvcmp --filename="$1" --size="$2"M --bs="$4" --iodepth="$5" --ioengine=io_uring \
        --direct=1 --rw="$3" --output-format=terse --terse-version=3 2>/dev/null)
  # terse v3: fields 6/9 read KiB and ms, 47/50 write KiB and ms
  echo "$out" | awk -F';' -v rw="$3" '{ kb = rw == "read" ? $6 : $47; ms = rw == "read" ? $9 : $50;
    if (ms > 0) printf "%.3f", kb * 1024 / (ms / 1000) / 1e9; else print "0" }'
}
# kv NAME FIELD ARGS...: one `$bin/kvbench NAME --json ARGS` run, one
# field of its JSON (empty if it failed; its stderr goes to $T/kvbench.err).
kv() {
  local name=$1 field=$2
  shift 2
  "$bin/kvbench" "$name" --json "$@" 2>>"$T/kvbench.err" | jq -r ".$field // empty"
}
# median: of the numbers on stdin (separated by spaces or lines).
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }'; }
# ratio A B: A / B to two places, "-" when B is 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
# machine DIR: one line each: cores, CPU, memory, DIR's disk and file
# system, kernel.
machine() {
  echo "- cores: $(nproc)"
  echo "- CPU: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "- memory: $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "- disk: $(df -PT "$1" | awk 'NR == 2 { printf "%s (%s, %.0f GiB), mounted on %s", $1, $2, $3 / 1048576, $7 }')"
  echo "- kernel: $(uname -sr)"
}
