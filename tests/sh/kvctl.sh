#!/usr/bin/env bash
# kvctl.sh - kvctl's worker-protocol commands against a real kvcached on a
# private socket directory: status --worker (table and JSON), lookup, put and get through the inline path,
# hex and --str keys, namespaces, bad usage (exit 2), failed operations and
# a daemon that is not running (exit 1, with a message that says so).
source "$(dirname "$0")/lib.bash"

KVCTL=$BIN/kvctl
RUN=$T/run
SOCK=$RUN/kvcached.sock

# --- no daemon yet: a clear message and exit 1 ---------------------------------
expect_exit 1 "status --worker without a daemon fails" "$KVCTL" status --worker --socket-dir "$RUN"
grep -q "kvctl: cannot reach kvcached at $SOCK: No such file or directory (is the daemon running?)" "$T/err" \
  && ok "and says which socket and why" || bad "no-daemon message: $(cat "$T/err")"
expect_exit 1 "lookup without a daemon fails" "$KVCTL" lookup 0a --socket-dir "$RUN"
expect_exit 1 "put without a daemon fails" "$KVCTL" put 0a --value x --socket "$SOCK"
expect_exit 1 "get without a daemon fails" "$KVCTL" get 0a --socket "$SOCK"
grep -q "is the daemon running?" "$T/err" && ok "get says so too" || bad "get no-daemon message: $(cat "$T/err")"
KVCACHED_SOCKET=$T/elsewhere.sock "$KVCTL" status --worker >"$T/out" 2>"$T/err"
grep -q "cannot reach kvcached at $T/elsewhere.sock" "$T/err" && ok "\$KVCACHED_SOCKET names the default socket" \
  || bad "KVCACHED_SOCKET: $(cat "$T/err")"

# --- usage errors need no daemon: exit 2 --------------------------------------------
expect_exit 2 "no command" "$KVCTL"
expect_exit 2 "unknown command" "$KVCTL" frobnicate
grep -q "unknown command 'frobnicate'" "$T/err" && ok "unknown command named" || bad "unknown command message"
expect_exit 0 "--help" "$KVCTL" --help
grep -q "^usage: kvctl COMMAND" "$T/out" && ok "--help prints the usage" || bad "--help output"
expect_exit 0 "get --help" "$KVCTL" get --help
expect_exit 2 "get without a key" "$KVCTL" get --socket-dir "$RUN"
expect_exit 2 "get with two keys" "$KVCTL" get 0a 0b --socket-dir "$RUN"
expect_exit 2 "lookup without keys" "$KVCTL" lookup --socket-dir "$RUN"
expect_exit 2 "put without a key" "$KVCTL" put --value x --socket-dir "$RUN"
expect_exit 2 "bad hex key" "$KVCTL" get zz --socket-dir "$RUN"
grep -q "bad key 'zz'" "$T/err" && ok "the bad key is named" || bad "bad key message: $(cat "$T/err")"
expect_exit 2 "odd number of hex digits" "$KVCTL" lookup abc --socket-dir "$RUN"
expect_exit 2 "empty key" "$KVCTL" lookup "" --socket-dir "$RUN"
long=$(printf '%066d' 1)   # 33 bytes
expect_exit 2 "key of 33 bytes" "$KVCTL" lookup "$long" --socket-dir "$RUN"
expect_exit 2 "--str key of 33 bytes" "$KVCTL" get --str "$(printf 'k%.0s' {1..33})" --socket-dir "$RUN"
expect_exit 2 "keys of different lengths in one lookup" "$KVCTL" lookup 0a 0b0c --socket-dir "$RUN"
expect_exit 2 "put without --value or --file" "$KVCTL" put 0a --socket-dir "$RUN"
expect_exit 2 "put with both --value and --file" "$KVCTL" put 0a --value x --file /dev/null --socket-dir "$RUN"
expect_exit 2 "unknown option" "$KVCTL" status --frob
expect_exit 2 "option without its value" "$KVCTL" status --socket
expect_exit 2 "an option the command does not take" "$KVCTL" get 0a --value x --socket-dir "$RUN"
grep -q "get does not take --value" "$T/err" && ok "and which" || bad "option not taken: $(cat "$T/err")"
expect_exit 2 "status takes no arguments" "$KVCTL" status --worker extra --socket-dir "$RUN"
expect_exit 2 "bad --block-bytes" "$KVCTL" get 0a --block-bytes 0 --socket-dir "$RUN"
expect_exit 2 "bad --prio" "$KVCTL" put 0a --value x --prio 300 --socket-dir "$RUN"
expect_exit 2 "--socket and --socket-dir together" "$KVCTL" status --worker --socket "$SOCK" --socket-dir "$RUN"
expect_exit 2 "--tp-rank not below --tp-size" "$KVCTL" lookup 0a --tp-rank 1 --socket-dir "$RUN"
expect_exit 2 "data larger than --block-bytes" "$KVCTL" put 0a --value 123456789 --block-bytes 8 --socket-dir "$RUN"
expect_exit 1 "a missing --file" "$KVCTL" put 0a --file "$T/none" --socket-dir "$RUN"
expect_exit 0 "version" "$KVCTL" version
expect_exit 0 "policies" "$KVCTL" policies
grep -q "\[default\]" "$T/out" && ok "policies marks the default" || bad "policies output"

# --- a real daemon ---------------------------------------------------------------------
"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 16M --set g2.page_size=4M --set g2.lock=no --g3-path "" \
  2>"$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready:" 10; then ok "kvcached ready"; else bad "kvcached ready: $(cat "$T/log")"; finish; exit; fi

expect_exit 0 "status --worker" "$KVCTL" status --worker --socket-dir "$RUN"
grep -q "^g2.capacity_bytes  *16777216 (16.0 MiB)" "$T/out" && ok "status shows G2 capacity" \
  || bad "status table: $(cat "$T/out")"
grep -q "^socket  *$SOCK" "$T/out" && ok "status names the socket" || bad "status socket row"
expect_exit 0 "status --worker --json" "$KVCTL" status --worker --json --socket "$SOCK"
check "status --json is the daemon's JSON" test "$(jq '.g2.capacity_bytes' "$T/out")" = 16777216
check "status --json carries the version" test "$(jq -r '.version' "$T/out")" = "$("$KVCTL" version | cut -d' ' -f2)"
KVCACHED_SOCKET=$SOCK "$KVCTL" status --worker --json >"$T/out" 2>"$T/err"
check "status finds the daemon through \$KVCACHED_SOCKET" test "$(jq '.g2.capacity_bytes' "$T/out")" = 16777216
# status binds no tenant: a daemon with one arena still serves kvctl's tenant afterwards.
check "status leaves the arena unbound" test "$(jq -r '.g2.tenants[0].tenant' "$T/out")" = ""

expect_exit 0 "put a hex key" "$KVCTL" put 0a0b --value hello --socket-dir "$RUN"
expect_exit 0 "put its child" "$KVCTL" put 0x0a0c --parent 0a0b --value world --socket-dir "$RUN"
expect_exit 1 "put an existing key fails" "$KVCTL" put 0a0b --value again --socket-dir "$RUN"
grep -q "block already exists" "$T/err" && ok "and says why" || bad "exists message: $(cat "$T/err")"
expect_exit 0 "lookup" "$KVCTL" lookup 0a0b 0a0c 0a0d --socket-dir "$RUN"
grep -q "^resident prefix: 2 of 3" "$T/out" && ok "lookup prints the resident prefix" || bad "lookup: $(cat "$T/out")"
grep -q "^0a0c  *G2$" "$T/out" && ok "lookup prints each key's tier" || bad "lookup tiers: $(cat "$T/out")"
grep -q "^0a0d  *-$" "$T/out" && ok "a missing key has no tier" || bad "lookup miss: $(cat "$T/out")"
expect_exit 0 "lookup --json" "$KVCTL" lookup 0a0d 0a0b --json --socket-dir "$RUN"
check "lookup --json: prefix 0 when the first key is missing" test "$(jq '.hit_len' "$T/out")" = 0
check "lookup --json: tiers" test "$(jq -c '[.keys[].tier]' "$T/out")" = '["-","G2"]'

# Options before the command work as after it (issue 16 item 12: "kvctl
# --socket-dir DIR status" was "unknown command '--socket-dir'").
expect_exit 0 "--socket-dir before status" "$KVCTL" --socket-dir "$RUN" status
grep -q "^hit rate" "$T/out" && ok "status read the stats socket in DIR" || bad "status with --socket-dir first: $(cat "$T/out")"
expect_exit 0 "-d before status --worker, --json after" "$KVCTL" -d "$RUN" status --worker --json
check "and reads the worker socket in DIR" test "$(jq '.g2.capacity_bytes' "$T/out")" = 16777216
expect_exit 0 "--socket and --json before lookup" "$KVCTL" --socket "$SOCK" --json lookup 0a0b 0a0c
check "lookup with its options first" test "$(jq '.hit_len' "$T/out")" = 2
expect_exit 0 "--timeout, --tenant and --socket-dir before get" \
  "$KVCTL" --timeout 5000 --tenant kvctl --socket-dir "$RUN" get 0a0b --out "$T/got_first"
"$KVCTL" get 0a0b --socket-dir "$RUN" --timeout 5000 --tenant kvctl --out "$T/got_after" >/dev/null 2>&1
check "get gives the same bytes either way" cmp -s "$T/got_first" "$T/got_after"
expect_exit 0 "--tenant before the command is that tenant" "$KVCTL" --tenant other --socket-dir "$RUN" --json lookup 0a0b
check "another tenant's namespace: it sees nothing" test "$(jq '.hit_len' "$T/out")" = 0
expect_exit 0 "--str and --socket-dir=DIR before lookup" "$KVCTL" --str --socket-dir="$RUN" lookup prompt/0
expect_exit 2 "options without a command" "$KVCTL" --socket-dir "$RUN"
grep -q "no command after the options" "$T/err" && ok "says so" || bad "no command: $(cat "$T/err")"
expect_exit 2 "an unknown option before the command" "$KVCTL" --frob status
grep -q "unknown option '--frob'" "$T/err" && ok "names it" || bad "unknown option first: $(cat "$T/err")"
expect_exit 2 "an option the command does not take, before it" "$KVCTL" --value x --socket-dir "$RUN" get 0a0b
grep -q "get does not take --value" "$T/err" && ok "is refused as after it" || bad "option not taken first: $(cat "$T/err")"

expect_exit 0 "get to a file" "$KVCTL" get 0a0b --out "$T/got" --socket-dir "$RUN"
{ printf hello; head -c 4091 /dev/zero; } > "$T/want"
check "get returns the value padded with zeros to 4096 bytes" cmp -s "$T/got" "$T/want"
"$KVCTL" get 0a0c --socket-dir "$RUN" > "$T/got2"
{ printf world; head -c 4091 /dev/zero; } > "$T/want2"
check "get to stdout" cmp -s "$T/got2" "$T/want2"
expect_exit 1 "get a missing key fails" "$KVCTL" get 0a0d --socket-dir "$RUN"
grep -q "block not found" "$T/err" && ok "and says why" || bad "not found message: $(cat "$T/err")"
expect_exit 1 "get to an unwritable file fails" "$KVCTL" get 0a0b --out "$T/no/such/dir" --socket-dir "$RUN"

# Files, block sizes: the block size is part of the namespace.
head -c 10000 /dev/urandom > "$T/blob"
expect_exit 0 "put --file larger than 4096 bytes" "$KVCTL" put 01 --file "$T/blob" --socket-dir "$RUN"
grep -q "block size 10000" "$T/err" && ok "put says which block size it used" || bad "block size hint: $(cat "$T/err")"
expect_exit 0 "get it back with that block size" "$KVCTL" get 01 --block-bytes 10000 --out "$T/blob2" --socket-dir "$RUN"
check "the file round-trips byte for byte" cmp -s "$T/blob" "$T/blob2"
expect_exit 1 "another block size is another namespace" "$KVCTL" get 01 --socket-dir "$RUN"
head -c 100 /dev/urandom > "$T/small"
expect_exit 0 "put --file with --block-bytes" "$KVCTL" put 02 --file "$T/small" --block-bytes 8K --socket-dir "$RUN"
"$KVCTL" get 02 --block-bytes 8192 --socket-dir "$RUN" > "$T/small2"
check "padded to --block-bytes" test "$(stat -c %s "$T/small2")" = 8192
check "the data leads the block" cmp -s "$T/small" <(head -c 100 "$T/small2")
printf 'from stdin' | "$KVCTL" put 03 --file - --socket-dir "$RUN" >/dev/null 2>&1
check "put --file - reads stdin" test "$("$KVCTL" get 03 --socket-dir "$RUN" | tr -d '\0')" = "from stdin"

# --str keys.
expect_exit 0 "put a --str key" "$KVCTL" put --str "prompt/1" --value text --socket-dir "$RUN"
expect_exit 0 "lookup --str" "$KVCTL" lookup --str "prompt/1" "prompt/2" --socket-dir "$RUN"
grep -q "^prompt/1  *G2$" "$T/out" && ok "lookup --str prints the keys as text" || bad "lookup --str: $(cat "$T/out")"
check "a --str key is its bytes" test "$("$KVCTL" lookup 70726f6d70742f31 --json --socket-dir "$RUN" | jq .hit_len)" = 1
check "get --str" test "$("$KVCTL" get --str "prompt/1" --socket-dir "$RUN" | tr -d '\0')" = text

# Namespaces: other layouts and other tenant names do not see the blocks. Without
# [tenant.NAME] sections every peer acts as the one default tenant, and a tenant
# name is a namespace of its own.
check "another dtype sees nothing" test "$("$KVCTL" lookup 0a0b --dtype bf16 --json --socket-dir "$RUN" | jq .hit_len)" = 0
check "another salt sees nothing" test "$("$KVCTL" lookup 0a0b --salt 00ff --json --socket-dir "$RUN" | jq .hit_len)" = 0
check "another tenant name sees nothing" test "$("$KVCTL" lookup 0a0b --tenant other --json --socket-dir "$RUN" | jq .hit_len)" = 0

expect_exit 0 "status after the writes" "$KVCTL" status --worker --json --socket-dir "$RUN"
check "status counts the blocks" test "$(jq '.g2.blocks' "$T/out")" -ge 6
check "status shows the one default tenant, bound to no name" \
  test "$(jq -c '[.g2.tenants[].tenant]' "$T/out")" = '[""]'

# --- the daemon goes away ----------------------------------------------------------------
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "kvcached stopped cleanly" || bad "kvcached exit status $rc"
expect_exit 1 "status after the daemon stopped" "$KVCTL" status --worker --socket-dir "$RUN"
grep -q "is the daemon running?" "$T/err" && ok "says the daemon is not running" || bad "stopped message: $(cat "$T/err")"
expect_exit 1 "get after the daemon stopped" "$KVCTL" get 0a0b --socket-dir "$RUN"
finish
