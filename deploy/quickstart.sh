#!/usr/bin/env bash
# quickstart.sh - from a fresh Debian 12 machine: install what kvcached
# needs, build it, and run the daemon on its default configuration
# (deploy/kvcached.conf: G2 in pinned host memory; G1 when a GPU is found),
# showing it working, then stop it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"

run=$(mktemp -d /tmp/kvcached-quickstart.XXXXXX)
log=$run/log
echo
echo "== starting kvcached with deploy/kvcached.conf (socket and G3 files in $run)"
./build/bin/kvcached --config deploy/kvcached.conf --socket-dir "$run" --g3-path "$run/g3" 2>"$log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$run"' EXIT
for _ in $(seq 100); do grep -q "ready:" "$log" && break; sleep 0.1; done
cat "$log"
grep -q "ready:" "$log" || { echo "kvcached did not become ready" >&2; exit 1; }

echo
echo "== a block stored and read back through the daemon (kvctl)"
./build/bin/kvctl put --str -d "$run" greeting --value "hello from kvcached"
./build/bin/kvctl get --str -d "$run" greeting | tr -d '\0'; echo
./build/bin/kvctl lookup --str -d "$run" greeting
./build/bin/kvctl status -d "$run"

echo
echo "== the cache core on a real workload trace (kvbench core-replay)"
trace=bench/traces/mooncake_synthetic_trace.jsonl
if [ -f "$trace" ]; then
  ./build/bin/kvbench core-replay --trace "$trace" >/dev/null
else
  echo "(no trace at $trace; skipped)"
fi

echo
echo "== stopping kvcached (SIGTERM)"
kill -TERM "$pid"
wait "$pid"
tail -n 2 "$log"
echo "kvcached exited cleanly"
