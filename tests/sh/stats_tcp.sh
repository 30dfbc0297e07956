#!/usr/bin/env bash
# stats_tcp.sh - the optional TCP stats listener (stats.listen): it serves
# /metrics and /health and nothing else (the other read-only routes, /keys
# above all, answer 403 there and stay on the Unix socket), refuses the
# state-changing ones, and a bad or taken address stops the daemon at start
# with a clear message.
source "$(dirname "$0")/lib.bash"

if ! command -v curl >/dev/null; then
  echo "skip: curl not installed"
  exit 77
fi

# A free loopback port, from the kernel.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

"$BIN/kvcached" --socket-dir "$T/run" --g2-capacity 4M --set g2.page_size=1M --set g2.lock=no \
  --g3-path "" --set "stats.listen=127.0.0.1:$port" >"$T/log" 2>&1 &
PIDS+=($!)
wait_for "$T/log" "operator sockets" 10 || { bad "daemon did not start: $(cat "$T/log")"; finish; exit 1; }

"$BIN/kvctl" put --str k1 --value v1 --socket-dir "$T/run" >/dev/null || bad "put"
curl -sf "http://127.0.0.1:$port/metrics" >"$T/metrics" || bad "GET /metrics over TCP"
check "TCP /metrics counts the put" grep -qE '^kvcached_requests_total\{op="put"\} 1$' "$T/metrics"
curl -sf "http://127.0.0.1:$port/health" >"$T/health" || bad "GET /health over TCP"
check "TCP /health answers ok" jq -e '.status == "ok"' "$T/health"
# /keys lets an observer test whether a guessed prompt is cached; /stats and
# /config describe the node. Over TCP they are refused, with the reason.
for route in /keys /stats /config "/keys?limit=5" /nope; do
  code=$(curl -s -o "$T/refused" -w '%{http_code}' "http://127.0.0.1:$port$route")
  check "GET $route over TCP is 403" test "$code" = 403
  check "... saying it is served on the Unix sockets only" \
    jq -e '.error | test("Unix sockets only")' "$T/refused"
done
S="$T/run/kvcached-stats.sock"
curl -sf --unix-socket "$S" http://kvcached/stats >"$T/stats" || bad "GET /stats on the Unix socket"
check "Unix /stats is JSON with the tiers" jq -e '.tiers.g2.blocks == 1' "$T/stats"
curl -sf --unix-socket "$S" http://kvcached/keys >"$T/keys" || bad "GET /keys on the Unix socket"
check "Unix /keys lists the put block" jq -e '.total == 1' "$T/keys"
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "http://127.0.0.1:$port/flush")
check "POST /flush over TCP is 403" test "$code" = 403
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "http://127.0.0.1:$port/config?name=log.level&value=debug")
check "POST /config over TCP is 403" test "$code" = 403

# A second daemon asking for the same port says why it cannot start.
"$BIN/kvcached" --socket-dir "$T/run2" --g2-capacity 4M --set g2.page_size=1M --set g2.lock=no \
  --g3-path "" --set "stats.listen=127.0.0.1:$port" >"$T/log2" 2>&1
rc=$?
check "a taken stats port fails the start" test "$rc" -ne 0
check "... and says so" grep -qiE "in use|$port" "$T/log2"

for bad_addr in "127.0.0.1" "127.0.0.1:99999" "not-an-ip:80"; do
  "$BIN/kvcached" --socket-dir "$T/run3" --g2-capacity 4M --set g2.lock=no --g3-path "" \
    --set "stats.listen=$bad_addr" --print-config >"$T/log3" 2>&1
  check "stats.listen=$bad_addr is refused (exit 2)" test $? -eq 2
done

kill -TERM "${PIDS[0]}"
wait "${PIDS[0]}"
check "daemon stops cleanly" test $? -eq 0
PIDS=()
finish
