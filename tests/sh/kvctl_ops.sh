#!/usr/bin/env bash
# kvctl_ops.sh - kvctl's operator commands (status, tiers, top, config,
# keys, health on the stats socket; config set, evict, flush, pin, unpin on
# the admin socket): bad usage (exit 2 and the command's usage line), a
# daemon that is not running (one clear line, exit 1), answers kvctl must
# report (503, 404, 403, not HTTP) from a stub server, then every command
# against a real kvcached with G2 and G3 on a private directory, the admin
# socket refusing a user who is not allowed, and the daemon going away.
source "$(dirname "$0")/lib.bash"

KVCTL=$BIN/kvctl
RUN=$T/run
R=(--socket-dir "$RUN")
STATS=$RUN/kvcached-stats.sock
ADMIN=$RUN/kvcached-admin.sock
NS0=0123456789abcdef

# usage_exit "description" command... : exit 2, and the command's usage line.
usage_exit() {
  local d=$1
  expect_exit 2 "$d" "${@:2}"
  grep -q "^usage: kvctl $3" "$T/err" || bad "$d: no usage line for $3: $(head -c 300 "$T/err")"
}

# --- bad usage: exit 2, no daemon needed -------------------------------------------------
usage_exit "evict without --tier" "$KVCTL" evict "${R[@]}"
usage_exit "evict --tier g1" "$KVCTL" evict --tier g1 "${R[@]}"
grep -q "bad --tier 'g1' (g2 or g3)" "$T/err" && ok "the bad tier is named" || bad "bad tier: $(cat "$T/err")"
usage_exit "evict --count 0" "$KVCTL" evict --tier g2 --count 0 "${R[@]}"
usage_exit "evict with an operand" "$KVCTL" evict --tier g2 extra "${R[@]}"
usage_exit "flush with an operand" "$KVCTL" flush g2 "${R[@]}"
usage_exit "flush --count (not taken)" "$KVCTL" flush --count 3 "${R[@]}"
grep -q "flush does not take --count" "$T/err" && ok "the option not taken is named" || bad "not taken: $(cat "$T/err")"
usage_exit "pin without --ns" "$KVCTL" pin 0a "${R[@]}"
usage_exit "pin without keys" "$KVCTL" pin --ns $NS0 "${R[@]}"
usage_exit "pin with a bad key" "$KVCTL" pin --ns $NS0 0a zz "${R[@]}"
usage_exit "unpin with a short --ns" "$KVCTL" unpin --ns 0123 0a "${R[@]}"
usage_exit "--ns not hex" "$KVCTL" keys --ns 0123456789abcdeg "${R[@]}"
usage_exit "keys --limit 0" "$KVCTL" keys --limit 0 "${R[@]}"
usage_exit "keys --limit 1001" "$KVCTL" keys --limit 1001 "${R[@]}"
usage_exit "keys --tier g4" "$KVCTL" keys --tier g4 "${R[@]}"
usage_exit "top --interval 0" "$KVCTL" top --interval 0 "${R[@]}"
usage_exit "top --interval abc" "$KVCTL" top --interval abc "${R[@]}"
usage_exit "top --count 0" "$KVCTL" top --count 0 "${R[@]}"
usage_exit "config without get or set" "$KVCTL" config "${R[@]}"
usage_exit "config frob" "$KVCTL" config frob "${R[@]}"
usage_exit "config get with two names" "$KVCTL" config get a.b c.d "${R[@]}"
usage_exit "config set without a value" "$KVCTL" config set log.level "${R[@]}"
usage_exit "config set of a name without a section" "$KVCTL" config set level debug "${R[@]}"
usage_exit "health with an operand" "$KVCTL" health now "${R[@]}"
usage_exit "health --json (not taken)" "$KVCTL" health --json "${R[@]}"
usage_exit "tiers --tier (not taken)" "$KVCTL" tiers --tier g2 "${R[@]}"
usage_exit "status --live (not taken)" "$KVCTL" status --live "${R[@]}"
usage_exit "status with an operand" "$KVCTL" status now "${R[@]}"
expect_exit 0 "--help" "$KVCTL" --help
for c in tiers top "config get" "config set" evict flush pin unpin keys health; do
  grep -q "^  $c" "$T/out" && ok "--help lists $c" || bad "--help lacks $c"
done

# --- no daemon: one clear line, exit 1 ------------------------------------------------------
for cmd in status tiers "top --count 1" "config get" keys health "health --live"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$cmd without a daemon" "$KVCTL" $cmd "${R[@]}"
  want="kvctl: cannot reach kvcached at $STATS: No such file or directory (is the daemon running?)"
  [ "$(cat "$T/err")" = "$want" ] && ok "$cmd says so in one line" || bad "$cmd: $(cat "$T/err")"
done
for cmd in "config set log.level debug" "evict --tier g2" flush "pin --ns $NS0 0a" "unpin --ns $NS0 0a"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$cmd without a daemon" "$KVCTL" $cmd "${R[@]}"
  want="kvctl: cannot reach kvcached at $ADMIN: No such file or directory (is the daemon running?)"
  [ "$(cat "$T/err")" = "$want" ] && ok "$cmd names the admin socket" || bad "$cmd: $(cat "$T/err")"
done
KVCACHED_SOCKET=$T/other/kvcached.sock "$KVCTL" status >"$T/out" 2>"$T/err"
grep -q "at $T/other/kvcached-stats.sock:" "$T/err" && ok "the stats socket is looked for beside \$KVCACHED_SOCKET" \
  || bad "KVCACHED_SOCKET: $(cat "$T/err")"
"$KVCTL" status --socket "$T/other/kvcached.sock" >"$T/out" 2>"$T/err"
grep -q "at $T/other/kvcached-stats.sock:" "$T/err" && ok "... and beside --socket" || bad "--socket: $(cat "$T/err")"

# --- answers kvctl must report, from a stub server ------------------------------------------
if ! command -v python3 >/dev/null; then
  echo "skip - stub-server answers: python3 not found"
else
  mkdir -p "$T/stub"
  cat > "$T/stub.py" <<'EOF'
import os, socket, sys
path, mode = sys.argv[1], sys.argv[2]
def http(status, body):
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, len(body), body)
answers = {
  "degraded": http(b"503 Service Unavailable", b'{"status":"degraded","reasons":["g3 full","g3 x"]}'),
  "forbidden": http(b"403 Forbidden", b'{"error":"peer uid 1000 is not"}'),
  "missing": http(b"404 Not Found", b"not found"),
  "garbage": b'SSH-2.0-OpenSSH_9.2\r\n',
  "eof": b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"status":"ok"}',
}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(answers[mode])
    c.close()
EOF
  # stub MODE: serves MODE's answer on $T/stub/kvcached-stats.sock.
  stub() {
    [ -n "${SPID:-}" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -f "$T/stub/kvcached-stats.sock" "$T/stub.log"
    python3 "$T/stub.py" "$T/stub/kvcached-stats.sock" "$1" >"$T/stub.log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    wait_for "$T/stub.log" listening 10 || bad "stub server did not start: $(cat "$T/stub.log")"
  }
  S=(--socket-dir "$T/stub")
  stub degraded
  expect_exit 1 "health: a degraded daemon exits 1" "$KVCTL" health "${S[@]}"
  grep -q "^degraded: g3 full, g3 x$" "$T/out" && ok "and says why" || bad "degraded output: $(cat "$T/out")"
  expect_exit 0 "health --live: a degraded daemon is alive" "$KVCTL" health --live "${S[@]}"
  stub eof
  expect_exit 0 "a response ended by the close, without Content-Length" "$KVCTL" health "${S[@]}"
  grep -q "^ok$" "$T/out" && ok "and its body is read" || bad "eof body: $(cat "$T/out")"
  stub missing
  expect_exit 1 "a route the daemon does not serve" "$KVCTL" tiers "${S[@]}"
  grep -q "GET /stats: this kvcached does not serve it (404)" "$T/err" && ok "says so" || bad "404: $(cat "$T/err")"
  stub garbage
  expect_exit 1 "a socket that does not speak HTTP" "$KVCTL" status "${S[@]}"
  grep -q "did not answer in HTTP/1.1" "$T/err" && ok "says so" || bad "garbage: $(cat "$T/err")"
  stub forbidden
  expect_exit 1 "a 403" "$KVCTL" keys "${S[@]}"
  grep -q "refused by $T/stub/kvcached-stats.sock: peer uid 1000 is not (the admin socket needs root, the daemon's user, or a member of admin.group)" "$T/err" \
    && ok "a 403 says who may use the admin socket" || bad "403: $(cat "$T/err")"
  kill "$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
fi

# --- a real daemon ----------------------------------------------------------------------------
"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 64M --g3-path "$T/g3" --g3-capacity 64M --foreground \
  --set g2.lock=no 2>"$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready:" 20; then ok "kvcached ready"; else bad "kvcached ready: $(cat "$T/log")"; finish; exit; fi
"$KVCTL" status --json "${R[@]}" >"$T/out" 2>"$T/err"
if grep -q "does not serve\|cannot reach" "$T/err"; then
  echo "skip: this kvcached does not serve the operator routes (GET /stats on $STATS): $(cat "$T/err")"
  exit 77
fi

expect_exit 0 "status --json" "$KVCTL" status --json "${R[@]}"
check "status --json is /stats: G2 capacity" test "$(jq '.tiers.g2.capacity_bytes' "$T/out")" = 67108864
check "status --json: G3 on" test "$(jq '.tiers.g3.enabled' "$T/out")" = true
check "status --json: the daemon's pid" test "$(jq '.pid' "$T/out")" = "$pid"
expect_exit 0 "status" "$KVCTL" status "${R[@]}"
grep -q "^g2  *ok  *64.0 MiB " "$T/out" && ok "status: the G2 row" || bad "status table: $(cat "$T/out")"
grep -q "^g3  *ok " "$T/out" && ok "status: the G3 row" || bad "status G3 row: $(cat "$T/out")"
grep -q "^hit rate  *- (0 hits, 0 misses" "$T/out" && ok "status: no hit rate before any lookup" || bad "status hit rate: $(cat "$T/out")"
grep -q "^misses  *absent 0, evicted 0, corrupt 0, io_error 0, timeout 0, not_shareable 0$" "$T/out" \
  && ok "status: misses by reason" || bad "status misses: $(cat "$T/out")"
grep -q "^sessions  *0, pins 0" "$T/out" && ok "status: sessions and pins" || bad "status sessions: $(cat "$T/out")"
expect_exit 0 "tiers" "$KVCTL" tiers "${R[@]}"
check "tiers: a header and one line per tier" test "$(wc -l < "$T/out")" = 4
grep -q "^g1  *off " "$T/out" && ok "tiers: G1 off without a GPU" || bad "tiers g1: $(cat "$T/out")"
expect_exit 0 "tiers --json" "$KVCTL" tiers --json "${R[@]}"
check "tiers --json: g1, g2, g3" test "$(jq -c 'keys' "$T/out")" = '["g1","g2","g3"]'
expect_exit 0 "health" "$KVCTL" health "${R[@]}"
grep -q "^ok$" "$T/out" && ok "health says ok" || bad "health: $(cat "$T/out")"
expect_exit 0 "health --live" "$KVCTL" health --live "${R[@]}"

# The deploy files' queries name only metrics this daemon exports.
if command -v curl >/dev/null; then
  curl -s --unix-socket "$STATS" http://kvcached/metrics | grep -o '^kvcached_[a-z0-9_]*' | sort -u > "$T/exported"
  cat "$SRC/deploy/grafana/kvcached-dashboard.json" "$SRC/deploy/prometheus/kvcached-alerts.yml" \
    | grep -o 'kvcached_[a-z0-9_]*' | sort -u > "$T/queried"
  check "the daemon exports metrics" test -s "$T/exported"
  unknown=$(grep -vxF -f "$T/exported" "$T/queried" | tr '\n' ' ')
  [ -z "$unknown" ] && ok "the dashboard and the alerts query only exported metrics ($(wc -l < "$T/queried"))" \
    || bad "queried but not exported: $unknown"
else
  echo "skip - exported metrics: curl not found"
fi

# Blocks, through the worker socket; a lookup makes hits and a miss.
for k in 0a01 0a02 0a03; do "$KVCTL" put $k --value "v$k" --socket-dir "$RUN" >/dev/null 2>&1 || bad "put $k"; done
"$KVCTL" lookup 0a01 0a02 0a09 --socket-dir "$RUN" >/dev/null 2>&1
expect_exit 0 "status after a lookup" "$KVCTL" status --json "${R[@]}"
check "three blocks in G2" test "$(jq '.tiers.g2.blocks' "$T/out")" = 3
hits=$(jq '[.tiers[].hits] | add' "$T/out")
misses=$(jq '[.misses[]] | add' "$T/out")
"$KVCTL" status "${R[@]}" >"$T/table"
check "status: the presence tables (none: kvctl asks the daemon)" \
  grep -q '^presence *0 namespaces mapped by workers' "$T/table"
if [ $((hits + misses)) -gt 0 ]; then
  want=$(awk -v h="$hits" -v m="$misses" 'BEGIN { printf "%.1f%% (%d hits, %d misses", 100 * h / (h + m), h, m }')
  grep -qF "$want" "$T/table" && ok "status: hit rate is hits over hits and misses ($want)" \
    || bad "status hit rate, wanted '$want': $(grep "hit rate" "$T/table")"
else
  bad "the lookup counted no hit and no miss"
fi

expect_exit 0 "keys" "$KVCTL" keys "${R[@]}"
grep -q "^KEY  *NS  *TIERS  *BYTES  *PINS  *PRIO  *HITS$" "$T/out" && ok "keys: the header" || bad "keys header: $(cat "$T/out")"
grep -q "^0a02  *[0-9a-f]\{16\}  *g2  *4096  *0  *128 " "$T/out" && ok "keys: a block's row" || bad "keys rows: $(cat "$T/out")"
grep -q "^3 of 3 blocks shown$" "$T/out" && ok "keys: the count" || bad "keys count: $(cat "$T/out")"
expect_exit 0 "keys --json --limit 1" "$KVCTL" keys --json --limit 1 "${R[@]}"
check "keys --limit 1: one key" test "$(jq '.keys | length' "$T/out")" = 1
check "keys --limit 1: total 3" test "$(jq '.total' "$T/out")" = 3
NS=$(jq -r '.keys[0].ns' "$T/out" | cut -c1-8)
check "a namespace digest" test "${#NS}" = 8
expect_exit 0 "keys --tier g3" "$KVCTL" keys --tier g3 --json "${R[@]}"
check "nothing in G3 yet" test "$(jq '.keys | length' "$T/out")" = 0
expect_exit 1 "keys --ns of a namespace the daemon does not have" "$KVCTL" keys --ns ffffffff "${R[@]}"
grep -q "^kvctl: GET /keys?ns=ffffffff: .* (HTTP 404)$" "$T/err" && ok "says so with the daemon's words" \
  || bad "unknown ns: $(cat "$T/err")"
expect_exit 0 "keys --ns of the blocks' namespace" "$KVCTL" keys --ns "$NS" --json "${R[@]}"
check "the namespace has the three" test "$(jq '.keys | length' "$T/out")" = 3

# pin / unpin
expect_exit 0 "pin" "$KVCTL" pin --ns "$NS" 0a01 "${R[@]}"
grep -q "^pinned 1 of 1 key$" "$T/out" && ok "pin says how many" || bad "pin: $(cat "$T/out")"
check "the block shows its pin" test "$("$KVCTL" keys --json "${R[@]}" | jq '[.keys[] | select(.key == "0a01")][0].pins')" = 1
expect_exit 1 "pin of a missing key fails" "$KVCTL" pin --ns "$NS" 0x0A02 0b0b "${R[@]}"
grep -q "kvctl: pin: 1 of 2 keys not found in namespace $NS" "$T/err" && ok "and says how many are missing" \
  || bad "pin missing: $(cat "$T/err")"
grep -q "^pinned 1 of 2 keys$" "$T/out" && ok "the key that exists is pinned (0x and upper case accepted)" || bad "pin partial: $(cat "$T/out")"
expect_exit 0 "unpin" "$KVCTL" unpin --ns "$NS" 0a02 "${R[@]}"
check "status counts the pin left" test "$("$KVCTL" status --json "${R[@]}" | jq '.pins')" = 1

# evict: through the policy, pinned blocks stay, G2 victims go to G3.
expect_exit 0 "evict --count 1" "$KVCTL" evict --tier g2 --count 1 "${R[@]}"
grep -q "^evicted 1 block from g2$" "$T/out" && ok "evict says how many" || bad "evict: $(cat "$T/out")"
expect_exit 0 "evict --json (all that can go)" "$KVCTL" evict --tier g2 --json "${R[@]}"
check "evict --json: one more (the third is pinned)" test "$(jq '.evicted' "$T/out")" = 1
"$KVCTL" keys --json "${R[@]}" >"$T/keys"
check "the pinned block is still in G2" test "$(jq -c '[.keys[] | select(.key == "0a01")][0].tiers' "$T/keys")" = '["g2"]'
for ((i = 0; i < 100; i++)); do   # the demotions to G3 complete on the daemon's loop
  [ "$("$KVCTL" keys --tier g3 --json "${R[@]}" | jq '.keys | length')" = 2 ] && break
  sleep 0.1
done
check "the two victims went to G3" test "$("$KVCTL" keys --tier g3 --json "${R[@]}" | jq -c '[.keys[].key] | sort')" = '["0a02","0a03"]'
check "status counts the G2 evictions" test "$("$KVCTL" status --json "${R[@]}" | jq '.tiers.g2.evictions')" -ge 2

# top: frames from successive /stats.
expect_exit 0 "top --json, 2 frames" "$KVCTL" top --count 2 --interval 0.1 --json "${R[@]}"
check "two frames" test "$(wc -l < "$T/out")" = 2
check "each frame has the rates and occupancy" test "$(jq -s 'map(has("hit_rate") and has("requests_per_s") and has("presence_updates_per_s") and (.bytes_per_s | has("g2_to_g3")) and (.occupancy | has("g2"))) | all' "$T/out")" = true
check "G1 has no occupancy" test "$(jq -s '.[0].occupancy.g1' "$T/out")" = null
"$KVCTL" status --json "${R[@]}" >"$T/st"
check "G2 occupancy is used over capacity" test "$(jq -s '.[1].occupancy.g2' "$T/out")" = "$(jq '.tiers.g2.used_bytes / .tiers.g2.capacity_bytes' "$T/st")"
expect_exit 0 "top, one frame as text" "$KVCTL" top --count 1 --interval 0.1 "${R[@]}"
grep -q "^hit rate .* requests [0-9.]*/s .* lookups [0-9.]*/s$" "$T/out" && ok "top: hit rate and requests/s" || bad "top: $(cat "$T/out")"
grep -q "^g2_to_g3 .*/s" "$T/out" && ok "top: bytes/s per direction" || bad "top directions: $(cat "$T/out")"
grep -q "^presence  0 namespaces mapped, [0-9.]* updates/s$" "$T/out" && ok "top: presence tables" \
  || bad "top presence: $(cat "$T/out")"
grep -q "^g2  ok  *\[[#.]*\]" "$T/out" && ok "top: occupancy per tier" || bad "top occupancy: $(cat "$T/out")"
"$KVCTL" top --interval 0.1 "${R[@]}" >"$T/top" 2>&1 &
tpid=$!
wait_for "$T/top" "^g3 " 20 || bad "top printed no frame"
kill -INT "$tpid"
wait "$tpid"
check "top stops on ctrl-c with exit 0" test $? = 0

# config
expect_exit 0 "config get" "$KVCTL" config get "${R[@]}"
grep -q "^cache.policy = adapt$" "$T/out" && ok "config get lists the settings" || bad "config get: $(head -c 300 "$T/out")"
check "config get lists them sorted" cmp -s "$T/out" <(sort "$T/out")
expect_exit 0 "config get NAME" "$KVCTL" config get cache.policy "${R[@]}"
check "config get NAME prints the value" test "$(cat "$T/out")" = adapt
expect_exit 0 "config set" "$KVCTL" config set cache.policy lfuda "${R[@]}"
grep -q "^cache.policy: adapt -> lfuda$" "$T/out" && ok "config set says what changed" || bad "config set: $(cat "$T/out")"
check "the change is live" test "$("$KVCTL" config get cache.policy "${R[@]}")" = lfuda
check "and status shows it" test "$("$KVCTL" status --json "${R[@]}" | jq -r '.policy.eviction')" = lfuda
expect_exit 0 "config get --json NAME" "$KVCTL" config get --json log.level "${R[@]}"
check "config get --json NAME is one member" test "$(jq -r '."log.level"' "$T/out")" = info
expect_exit 1 "config set of a restart-only setting" "$KVCTL" config set g2.page_size 8M "${R[@]}"
grep -q "changes only on restart" "$T/err" && ok "says it changes only on restart" || bad "409: $(cat "$T/err")"
expect_exit 1 "config set of a bad value" "$KVCTL" config set log.level "very loud" "${R[@]}"
grep -q "very loud" "$T/err" && ok "the value travels URL-encoded and comes back in the error" || bad "bad value: $(cat "$T/err")"
expect_exit 1 "config get of an unknown setting" "$KVCTL" config get no.such "${R[@]}"
grep -q "no setting 'no.such'" "$T/err" && ok "says so" || bad "unknown setting: $(cat "$T/err")"

# flush: drops unpinned blocks, no demotion.
expect_exit 0 "flush --tier g3" "$KVCTL" flush --tier g3 "${R[@]}"
grep -q "^dropped 2 blocks from g3$" "$T/out" && ok "flush --tier g3 drops the two" || bad "flush g3: $(cat "$T/out")"
"$KVCTL" put 0a04 --value x --socket-dir "$RUN" >/dev/null 2>&1
expect_exit 0 "flush --ns (both tiers)" "$KVCTL" flush --ns "$NS" --json "${R[@]}"
check "flush: the unpinned block is dropped" test "$(jq '.dropped' "$T/out")" = 1
check "only the pinned block is left" test "$("$KVCTL" keys --json "${R[@]}" | jq -c '[.keys[].key]')" = '["0a01"]'
expect_exit 0 "unpin the last" "$KVCTL" unpin --ns "$NS" 0a01 "${R[@]}"
expect_exit 0 "flush" "$KVCTL" flush "${R[@]}"
check "nothing is left" test "$("$KVCTL" keys --json "${R[@]}" | jq '.total')" = 0

# The admin socket and a user who may not use it.
if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  chmod o+x "$T" "$RUN"
  AS=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
  expect_exit 0 "the stats socket serves anyone" "${AS[@]}" "$KVCTL" status "${R[@]}"
  expect_exit 1 "the admin socket refuses another user" "${AS[@]}" "$KVCTL" evict --tier g2 "${R[@]}"
  grep -q "cannot reach kvcached at $ADMIN: Permission denied (the admin socket needs root, the daemon's user, or a member of admin.group)" "$T/err" \
    && ok "and says who may use it" || bad "admin EACCES: $(cat "$T/err")"
  chmod 0666 "$ADMIN"   # past the file mode: the daemon's own check answers
  expect_exit 1 "the daemon refuses a peer by its credentials" "${AS[@]}" "$KVCTL" flush "${R[@]}"
  grep -q "POST /flush refused by $ADMIN: .*(the admin socket needs root, the daemon's user, or a member of admin.group)" "$T/err" \
    && ok "a 403 says who may use the admin socket" || bad "admin 403: $(cat "$T/err")"
  chmod 0600 "$ADMIN"
else
  echo "skip - admin refusal: no setpriv or no user nobody"
fi

# --- the daemon goes away --------------------------------------------------------------------
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached stopped cleanly" || bad "kvcached exit status $rc"
expect_exit 1 "status after the daemon stopped" "$KVCTL" status "${R[@]}"
grep -q "^kvctl: cannot reach kvcached at $STATS: .* (is the daemon running?)$" "$T/err" && ok "says the daemon is not running" \
  || bad "stopped: $(cat "$T/err")"
expect_exit 1 "health after the daemon stopped" "$KVCTL" health --live "${R[@]}"
expect_exit 1 "evict after the daemon stopped" "$KVCTL" evict --tier g2 "${R[@]}"
finish
