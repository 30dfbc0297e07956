#!/usr/bin/env bash
# g3_vs_fio.sh - the G3 store against fio on the same disk: for each block
# size and queue depth, fio (io_uring, O_DIRECT, a fresh file, sequential
# write then read) and `kvbench g3` (a fresh store of the same size, write
# then verified read), side by side, REPS runs each, interleaved (who goes
# first alternates), with the ratio ours/fio of the medians (or of the best
# runs). The G3 target is >= 0.9. fio flushes nothing; a kvbench write
# counts only once it is durable and indexed (-s batch, the default).
#
# usage: tools/bench/g3_vs_fio.sh [-d DIR] [-m SIZE_MIB] [-r REPS] [-a median|best]
#            [-b "256K 1M 4M"] [-q "1 8 32"] [-s batch|dsync|none] [-k KVBENCH]
#   DIR      a directory on the disk to measure (default: a new one in /tmp;
#            it must not be a tmpfs)
#   SIZE_MIB bytes moved per run, MiB (default 1024)
#   REPS     runs per cell (default 3); -a picks the median (default) or best
#   KVBENCH  the kvbench binary (default: build-g3/bin/kvbench, build/bin/kvbench)
# Needs fio. Default runtime: about three minutes. On a noisy (virtual) disk
# single runs vary by 2x; medians of more runs settle the ratios.
set -euo pipefail
prog=g3_vs_fio
source "$(dirname "$0")/lib.sh"
here=$bench_root
dir="" size_mib=1024 reps=3 agg=median sizes="256K 1M 4M" depths="1 8 32" sync=batch kvbench=""
while getopts "d:m:r:a:b:q:s:k:h" o; do
  case $o in
    d) dir=$OPTARG ;; m) size_mib=$OPTARG ;; r) reps=$OPTARG ;; a) agg=$OPTARG ;; b) sizes=$OPTARG ;;
    q) depths=$OPTARG ;; s) sync=$OPTARG ;; k) kvbench=$OPTARG ;;
    h) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
if [ -z "$kvbench" ]; then
  for c in "$here/build-g3/bin/kvbench" "$here/build/bin/kvbench"; do
    if [ -x "$c" ]; then kvbench=$c; break; fi
  done
fi
[ -x "${kvbench:-}" ] || { echo "g3_vs_fio: no kvbench binary (build first, or -k PATH)" >&2; exit 2; }
command -v fio >/dev/null || { echo "g3_vs_fio: fio not found (deploy/install-deps.sh)" >&2; exit 2; }
made=0
if [ -z "$dir" ]; then dir=$(mktemp -d /tmp/g3-vs-fio.XXXXXX); made=1; fi
cleanup() { rm -f "$dir/fio.dat"; if [ $made = 1 ]; then rm -rf "$dir"; fi; }
trap cleanup EXIT

json_field() { sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p"; }
# median or best of the numbers on stdin
pick() { sort -g | awk -v agg="$agg" '{ v[NR] = $1 } END {
  if (NR == 0) { print 0; exit }
  if (agg == "best") print v[NR]; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "disk: $(df -h "$dir" | awk 'NR==2 {print $1 " (" $2 ")"}'), dir $dir, ${size_mib} MiB per run, $agg of $reps, kvbench sync=$sync"
printf "%-6s %4s | %9s %9s %6s | %9s %9s %6s\n" bs qd "fio_w" "g3_w" "w" "fio_r" "g3_r" "r"
printf "%-6s %4s | %9s %9s %6s | %9s %9s %6s\n" "" "" "GB/s" "GB/s" "ratio" "GB/s" "GB/s" "ratio"
worst=99
for bs in $sizes; do
  b=$(bytes_of "$bs")
  count=$(( (size_mib << 20) / b ))
  for qd in $depths; do
    fws="" frs="" gws="" grs=""
    for rep in $(seq "$reps"); do
      # who goes first alternates, so a slow spell of the disk hits both
      for who in $( ((rep % 2)) && echo "fio g3" || echo "g3 fio"); do
        if [ "$who" = fio ]; then
          rm -f "$dir/fio.dat"
          fws="$fws $(fio_gbps "$dir/fio.dat" "$size_mib" write "$bs" "$qd")"
          frs="$frs $(fio_gbps "$dir/fio.dat" "$size_mib" read "$bs" "$qd")"
          rm -f "$dir/fio.dat"
        else
          j=$("$kvbench" g3 --dir "$dir" --block-bytes "$b" --qd "$qd" --count "$count" \
                --sync "$sync" --json 2>/dev/null) || { echo "g3_vs_fio: kvbench g3 failed" >&2; exit 1; }
          gws="$gws $(echo "$j" | json_field write_gbps)"
          grs="$grs $(echo "$j" | json_field read_gbps)"
        fi
      done
    done
    fw=$(echo $fws | tr ' ' '\n' | pick) fr=$(echo $frs | tr ' ' '\n' | pick)
    gw=$(echo $gws | tr ' ' '\n' | pick) gr=$(echo $grs | tr ' ' '\n' | pick)
    rw=$(ratio "$gw" "$fw") rr=$(ratio "$gr" "$fr")
    printf "%-6s %4s | %9.3f %9.3f %6s | %9.3f %9.3f %6s\n" "$bs" "$qd" "$fw" "$gw" "$rw" "$fr" "$gr" "$rr"
    worst=$(awk -v w="$worst" -v a="$rw" -v b="$rr" 'BEGIN { m = w; if (a + 0 < m) m = a; if (b + 0 < m) m = b; print m }')
  done
done
echo "lowest ratio: $worst (target >= 0.9)"
