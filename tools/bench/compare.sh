#!/usr/bin/env bash
# compare.sh - every data path of kvcached beside its reference, in one run
# on one machine, as a markdown table (ours, reference, ratio; medians of
# REPS rounds, each round measuring every row once, so the two sides of a
# row meet the same noise). 256 KiB blocks, G3 queue depth 32:
#
#   G2 load        kvbench load (LOAD, copy out, RELEASE)   vs  kvbench memcpy, and Redis GET
#   G2 store       kvbench store (ALLOC, copy in, COMMIT)   vs  Redis SET (redis-benchmark -d 262144)
#   G3 swap-in     kvbench swapin (LOAD of blocks on the    vs  fio read, io_uring, O_DIRECT,
#                  SSD only, verified, copied out)              bs 256K, iodepth 32
#   G3 write       kvbench g3 (the SSD store alone)         vs  fio write, same file size
#   lookup         kvbench lookup: batched keys/s           vs  the 2 M keys/s target
#                  single-key round trip p50                vs  Redis PING round trip p50
#
# It starts its own servers on Unix sockets in a temporary directory: a
# kvcached with G3 off (G2 paths), one with G3 in DIR (swap-in), a
# redis-server (--port 0 --unixsocket), and stops them at the end. Then it
# prints the machine (cores, CPU, memory, DIR's disk and file system,
# kernel) and the table.
#
# usage: tools/bench/compare.sh [-b BIN_DIR] [-d DIR] [-r REPS] [--quick]
#   BIN_DIR  where kvcached and kvbench are (default build/bin, else build-tools/bin)
#   DIR      a directory on the disk to measure (default: the temporary one,
#            in $TMPDIR or /tmp; it must not be a tmpfs: O_DIRECT)
#   REPS     rounds (default 3; --quick: 1)
#   --quick  small working sets and short runs (64 MiB, 0.5 s, fio 128 MiB):
#            about 10 s on a 2-core VM, so the suite runs it once
#            (tests/sh/kvbench_daemon.sh: it completes and fills every row;
#            its numbers are printed, never asserted)
# Full run: about 3 minutes. Needs fio, redis-server, redis-benchmark,
# redis-cli and jq (deploy/install-deps.sh).
set -u
prog=compare
source "$(dirname "$0")/lib.sh"

bindir="" dir="" reps=3 quick=0
while [ $# -gt 0 ]; do
  case $1 in
    -b) bindir=${2:?}; shift ;;
    -d) dir=${2:?}; shift ;;
    -r) reps=${2:?}; shift ;;
    --quick|-q) quick=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$prog: unknown option '$1' (-h for help)" >&2; exit 2 ;;
  esac
  shift
done
bin=$(find_bin "$bindir") || exit 2
need fio redis-server redis-benchmark redis-cli jq
bench_tmp
[ -n "$dir" ] || dir=$T
[ "$(df -PT "$dir" | awk 'NR == 2 { print $2 }')" != tmpfs ] || die "$dir is a tmpfs: no O_DIRECT (-d DIR on a disk)"

BLOCK=262144 QD=32
if [ "$quick" = 1 ]; then
  [ "$reps" = 3 ] && reps=1
  set_mib=64 secs=0.5 fio_mib=128 rreq=1000 g2=256M swap_g2=64M swap_g3=256M
else
  set_mib=512 secs=2 fio_mib=1024 rreq=10000 g2=2G swap_g2=512M swap_g3=2G
fi
NBLK=$((set_mib * 1048576 / BLOCK))

start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity "$g2" --set g2.lock=no --g3-path ""
start_kvcached "$T/kvcached-g3.log" --socket-dir "$T/run-g3" --g2-capacity "$swap_g2" --set g2.lock=no \
  --g3-path "$dir/g3-daemon" --g3-capacity "$swap_g3" --set g3.block_bytes=$BLOCK --set g3.queue_depth=$QD
start_redis "$T/redis.sock"
fill_redis "$T/redis.sock" "$NBLK" "$BLOCK"

declare -A V=()
add() { [ -n "$2" ] || die "$1 failed: $(tail -3 "$T/kvbench.err" "$T/redis.log" 2>/dev/null)"; V[$1]="${V[$1]:-} $2"; }
for _ in $(seq "$reps"); do
  add memcpy "$(kv memcpy gbps --seconds "$secs" --block-bytes $BLOCK --blocks $NBLK)"
  add load "$(kv load gbps --seconds "$secs" --socket-dir "$T/run" --block-bytes $BLOCK --blocks $NBLK)"
  add get "$(redis_gbps "$T/redis.sock" get $BLOCK $NBLK $rreq 1)"
  add store "$(kv store gbps --seconds "$secs" --socket-dir "$T/run" --block-bytes $BLOCK)"
  add set "$(redis_gbps "$T/redis.sock" set $BLOCK $NBLK $rreq 1)"
  add swapin "$(kv swapin gbps --socket-dir "$T/run-g3" --block-bytes $BLOCK --depth 2 --batch 16)"
  rm -f "$dir/fio.dat"
  add fio_w "$(fio_gbps "$dir/fio.dat" $fio_mib write 256K $QD)"
  add fio_r "$(fio_gbps "$dir/fio.dat" $fio_mib read 256K $QD)"
  rm -f "$dir/fio.dat"
  rm -rf "$dir/g3-store" && mkdir -p "$dir/g3-store"
  add g3_w "$(kv g3 write_gbps --dir "$dir/g3-store" --block-bytes $BLOCK --qd $QD --count $((fio_mib * 4)))"
  rm -rf "$dir/g3-store"
  "$bin/kvbench" lookup --json --seconds "$secs" --socket-dir "$T/run" --block-bytes $BLOCK \
    >"$T/lookup.json" 2>>"$T/kvbench.err" || die "lookup failed: $(tail -3 "$T/kvbench.err")"
  add keys "$(jq '.keys_per_s / 1e6' "$T/lookup.json")"
  add rtt "$(jq .rtt_p50_us "$T/lookup.json")"
  add ping "$(redis_p50_us "$T/redis.sock")"
done
m() { echo "${V[$1]}" | median; }

echo "## kvcached beside its references ($(date -u +%Y-%m-%d), median of $reps round(s)$([ "$quick" = 1 ] && echo ", --quick"))"
echo
machine "$dir"
echo "- kvcached $("$bin/kvcached" --version 2>/dev/null | head -1 | awk '{ print $NF }'), $(redis-server --version | awk '{ print "Redis " substr($3, 3) }'), $(fio --version)"
echo "- blocks of $BLOCK bytes; G2 working set $set_mib MiB; fio and kvbench g3 on $fio_mib MiB; G3 queue depth $QD; one client each"
echo
echo "| path | ours | reference | ours / reference |"
echo "|---|---|---|---|"
row() { printf "| %s | %.3f | %.3f (%s) | %s |\n" "$1" "$(m "$2")" "$(m "$3")" "$4" "$(ratio "$(m "$2")" "$(m "$3")")"; }
row "G2 load (LOAD + copy out + RELEASE), GB/s" load memcpy "memcpy"
row "G2 load, GB/s" load get "Redis GET over a Unix socket"
row "G2 store (ALLOC + copy in + COMMIT), GB/s" store set "Redis SET over a Unix socket"
row "G3 swap-in (LOAD from the SSD, verified, copied out), GB/s" swapin fio_r "fio read, io_uring, O_DIRECT"
row "G3 write (the SSD store alone, kvbench g3), GB/s" g3_w fio_w "fio write, io_uring, O_DIRECT"
printf "| batched lookup (1024 keys), M keys/s | %.2f | 2.00 (target) | %s |\n" "$(m keys)" "$(ratio "$(m keys)" 2)"
printf "| single-key lookup round trip p50, µs (lower is better) | %.1f | %.1f (Redis PING round trip p50) | %s |\n" \
  "$(m rtt)" "$(m ping)" "$(ratio "$(m rtt)" "$(m ping)")"
