#!/usr/bin/env bash
# kvctl_get_g3.sh - `kvctl get` of a block that is only on G3 (issue 16
# item 12: GET answered "block not found" where LOAD would promote it): it
# comes up to G2, verified, and its bytes are returned; a G3 record whose
# bytes were damaged on disk is refused as corrupt, never served.
source "$(dirname "$0")/lib.bash"

KVCTL=$BIN/kvctl
RUN=$T/run
"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 16M --set g2.page_size=4M --set g2.lock=no \
  --g3-path "$T/g3" --g3-capacity 8M --set g3.block_bytes=64K --set g3.backend=threads 2>"$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready:" 10; then ok "kvcached ready"; else bad "kvcached ready: $(cat "$T/log")"; finish; exit; fi

# tier_of KEY: the key's tier as lookup reports it (G2, G3, -).
tier_of() { "$KVCTL" lookup "$1" --json --socket-dir "$RUN" | jq -r '.keys[0].tier'; }
# to_g3 KEY: evict G2 (victims are demoted) and wait for KEY to be on G3 only.
to_g3() {
  "$KVCTL" evict --tier g2 --socket-dir "$RUN" >/dev/null 2>&1
  local i
  for ((i = 0; i < 100; i++)); do
    [ "$(tier_of "$1")" = G3 ] && return 0
    sleep 0.1
  done
  return 1
}

value=kvtest-g3-payload-0a01
expect_exit 0 "put a block" "$KVCTL" put 0a01 --value "$value" --socket-dir "$RUN"
if to_g3 0a01; then ok "evicted from G2, it is on G3 only"; else bad "0a01 tier: $(tier_of 0a01)"; fi
expect_exit 0 "get of a block only on G3" "$KVCTL" get 0a01 --out "$T/got" --socket-dir "$RUN"
{ printf %s "$value"; head -c $((4096 - ${#value})) /dev/zero; } > "$T/want"
check "returns its bytes" cmp -s "$T/got" "$T/want"
check "and leaves it in G2, as LOAD does" test "$(tier_of 0a01)" = G2
expect_exit 0 "status after the promotion" "$KVCTL" status --json --socket-dir "$RUN"
check "no pin is left behind" test "$(jq '.pins' "$T/out")" = 0

# A record damaged on disk: the bytes fail their checksum on the way up.
value2=kvtest-g3-payload-0a02-damaged
expect_exit 0 "put a second block" "$KVCTL" put 0a02 --value "$value2" --socket-dir "$RUN"
if to_g3 0a02; then ok "it is on G3 only"; else bad "0a02 tier: $(tier_of 0a02)"; fi
off=$(grep -boa "$value2" "$T/g3/kvg3-0.dat" | head -1 | cut -d: -f1)
if [ -n "$off" ]; then
  printf 'X' | dd of="$T/g3/kvg3-0.dat" bs=1 seek="$off" conv=notrunc status=none
  ok "its payload damaged at offset $off of the G3 file"
else
  bad "payload not found in the G3 file"
fi
expect_exit 1 "get of a damaged G3 record fails" "$KVCTL" get 0a02 --out "$T/got2" --socket-dir "$RUN"
grep -q "get 0a02: stored bytes failed their checksum" "$T/err" && ok "as corrupt" || bad "corrupt get: $(cat "$T/err")"
check "nothing written" test ! -s "$T/got2"
expect_exit 0 "status after the failed get" "$KVCTL" status --json --socket-dir "$RUN"
check "counted as a corrupt miss" test "$(jq '.misses.corrupt' "$T/out")" = 1
check "no pin is left behind" test "$(jq '.pins' "$T/out")" = 0
expect_exit 1 "get of a missing block is not found" "$KVCTL" get 0a03 --socket-dir "$RUN"
grep -q "block not found" "$T/err" && ok "and says so" || bad "not found: $(cat "$T/err")"

kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached stopped cleanly" || bad "kvcached exit status $rc"
finish
