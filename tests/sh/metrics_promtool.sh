#!/usr/bin/env bash
# metrics_promtool.sh - a daemon with some traffic (kvctl put/get/lookup)
# serves /metrics that `promtool check metrics` finds clean, over the stats
# socket; the admin socket refuses nothing to its own user.
source "$(dirname "$0")/lib.bash"

if ! command -v promtool >/dev/null; then
  echo "skip: promtool not installed (Debian package prometheus)"
  exit 77
fi
if ! command -v curl >/dev/null; then
  echo "skip: curl not installed"
  exit 77
fi

"$BIN/kvcached" --socket-dir "$T/run" --g2-capacity 4M --set g2.page_size=1M --set g2.lock=no \
  --g3-path "$T/g3" --g3-capacity 4M --set g3.block_bytes=64K --set g3.backend=threads \
  >"$T/log" 2>&1 &
PIDS+=($!)
wait_for "$T/log" "operator sockets" 10 || { bad "daemon did not start: $(cat "$T/log")"; finish; exit 1; }
S="$T/run/kvcached-stats.sock"
A="$T/run/kvcached-admin.sock"
K=(--socket-dir "$T/run")

for i in 1 2 3 4 5 6 7 8; do
  "$BIN/kvctl" put --str "key$i" --value "block $i" "${K[@]}" >/dev/null || bad "put key$i"
done
"$BIN/kvctl" get --str key3 "${K[@]}" >"$T/got" || bad "get key3"
check "get returns what put stored" grep -qa 'block 3' "$T/got"
"$BIN/kvctl" lookup --str key1 keyX "${K[@]}" >/dev/null 2>&1
curl -sf -XPOST --unix-socket "$A" "http://kvcached/evict?tier=g2&count=2" >"$T/evict" || bad "POST /evict"
check "evict answers a count" grep -q '"evicted":2' "$T/evict"

curl -sf --unix-socket "$S" http://kvcached/metrics >"$T/metrics" || bad "GET /metrics"
if promtool check metrics <"$T/metrics" >"$T/promtool" 2>&1; then
  ok "promtool check metrics: clean"
else
  bad "promtool check metrics: $(head -c 600 "$T/promtool")"
fi
check "lookups counted" grep -qE '^kvcached_lookups_total [1-9]' "$T/metrics"
check "the absent miss counted" grep -qE '^kvcached_misses_total\{reason="absent"\} [1-9]' "$T/metrics"
check "puts counted" grep -qE '^kvcached_requests_total\{op="put"\} 8$' "$T/metrics"
check "evictions counted" grep -qE '^kvcached_evictions_total\{tier="g2"\} 2$' "$T/metrics"
check "G3 is ok" grep -qE '^kvcached_g3_state\{state="ok"\} 1$' "$T/metrics"
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST --unix-socket "$S" http://kvcached/flush)
check "POST /flush on the stats socket is 403" test "$code" = 403
code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$S" http://kvcached/health)
check "GET /health is 200" test "$code" = 200

kill -TERM "${PIDS[0]}"
wait "${PIDS[0]}"
check "daemon stops cleanly" test $? -eq 0
check "operator sockets removed at stop" test ! -e "$S" -a ! -e "$A"
PIDS=()
finish
