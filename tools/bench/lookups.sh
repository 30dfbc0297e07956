#!/usr/bin/env bash
# lookups.sh - what a lookup costs a worker, in one run on one machine:
# kvc_lookup answered from the namespace's presence table (protocol 1.5,
# no round trip) beside the same lookups asked of the daemon (LOOKUP over
# the worker socket), and a Redis GET of a small value over a Unix socket
# (the reference: the usual cost of asking another process on the node).
# Starts its own kvcached (G3 off) and redis-server, both on Unix sockets
# in a temporary directory, and stops them at the end.
#
#   C        kvbench presence: chains of 1, 16 and 256 resident keys; p50
#            and p99 of single calls, calls per second on one thread
#   Python   tools/bench/lookups_py.py: kvclient.Client.lookup, both ways,
#            and the vLLM connector's get_num_new_matched_tokens per
#            request (its own method on a Request of the installed vLLM)
# Each figure is the median of REPS runs; the runs alternate, so that the
# machine's load weighs on both sides alike. Goals (issue: lookups without
# a round trip): p50 <= 1 us for a 16-key chain in C, <= 10 us from Python.
#
# usage: tools/bench/lookups.sh [-b BIN_DIR] [-s SECONDS] [-r REPS] [-P]
#   SECONDS  per measurement (default 1)
#   REPS     runs (default 3)
#   -P       skip the Python part
# Needs redis-server, redis-cli and jq (deploy/install-deps.sh), and for
# the Python part the project's venv (deploy/install-python.sh).
set -u
prog=lookups
source "$(dirname "$0")/lib.sh"

bindir="" secs=1 reps=3 py=1
while getopts "b:s:r:Ph" o; do
  case $o in
    b) bindir=$OPTARG ;; s) secs=$OPTARG ;; r) reps=$OPTARG ;; P) py=0 ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
bin=$(find_bin "$bindir") || exit 2
need redis-server redis-cli jq
python=${KV_PYTHON3:-}
for p in /opt/kvcached-deps/venv/bin/python "$HOME/.cache/kvcached/deps/venv/bin/python"; do
  [ -z "$python" ] && [ -x "$p" ] && python=$p
done
[ "$py" = 0 ] || [ -n "$python" ] || die "no Python environment (deploy/install-python.sh), or -P"
bench_tmp
start_kvcached "$T/kvcached.log" --socket-dir "$T/run" --g2-capacity 64M --g3-path ""
start_redis "$T/redis.sock"
lib=$(dirname "$bin")/lib/libkvclient.so

cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
echo "lookups: presence table vs the daemon's LOOKUP vs Redis GET; median of $reps runs of ${secs}s"
rv=$(redis-server --version | awk '{ print $3 }')
echo "machine: ${cpu:-unknown CPU}, $(nproc) cores; redis $rv"
echo
: >"$T/c.json"
: >"$T/py.json"
for _ in $(seq "$reps"); do
  "$bin/kvbench" presence --json --seconds "$secs" --socket "$T/run/kvcached.sock" \
    --redis "$T/redis.sock" >>"$T/c.json" 2>>"$T/kvbench.err" ||
    die "kvbench presence failed: $(tail -3 "$T/kvbench.err")"
  if [ "$py" = 1 ]; then
    KVCLIENT_LIB=$lib "$python" "$(dirname "$0")/lookups_py.py" "$T/run/kvcached.sock" \
      --seconds "$secs" --json >>"$T/py.json" 2>>"$T/py.err" ||
      die "lookups_py.py failed: $(tail -3 "$T/py.err")"
  fi
done
# medians per row, over the runs (one JSON array per line)
jq -rs '
  [.[][]] | group_by([.path // .what, .keys]) | map({
    what: (.[0].path // .[0].what), keys: .[0].keys,
    p50: ([.[].p50_ns] | sort | .[(length - 1) / 2 | floor]),
    p99: ([.[].p99_ns] | sort | .[(length - 1) / 2 | floor]),
    rate: ([.[].calls_per_s] | sort | .[(length - 1) / 2 | floor])}) | sort_by(.keys) | .[] |
  def us: . / 1000 * 100 | round / 100 | tostring + " us";
  "| \(.what) | \(.keys) | \(.p50 | us) | \(.p99 | us) | \(.rate | round) |"
' "$T/c.json" "$([ "$py" = 1 ] && echo "$T/py.json" || echo /dev/null)" >"$T/rows"
echo "| lookup | keys | p50 | p99 | calls/s (one thread) |"
echo "|---|---:|---:|---:|---:|"
cat "$T/rows"
[ ! -s "$T/py.err" ] || { echo; sed 's/^/# /' "$T/py.err"; }
