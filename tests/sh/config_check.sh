#!/usr/bin/env bash
# config_check.sh - one validator: every configuration `kvctl check-config`
# refuses, kvcached refuses too, with the same messages, before it creates
# anything (socket directory, G3 directory or files). Each case of issue 16
# item 11 used to pass `kvctl check-config` (queue depth, block size 0 or
# above g3.capacity, an unknown admin.group, G2 above the machine's memory),
# and the daemon either failed after building part of its state or started.
source "$(dirname "$0")/lib.bash"

KVCTL=$BIN/kvctl
mem_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
over_mem="$((mem_kib * 2))K"

# conf FILE DIR [SECTION NAME VALUE]...: a small configuration rooted in DIR.
conf() {
  local f=$1 dir=$2
  shift 2
  {
    printf '[daemon]\nsocket_dir = %s/run\n' "$dir"
    printf '[g2]\ncapacity = 16M\npage_size = 4M\nlock = no\n'
    printf '[g3]\npath = %s/g3\ncapacity = 8M\nblock_bytes = 64K\nbackend = threads\n' "$dir"
    printf '[log]\nlevel = info\n'
    while [ $# -ge 3 ]; do printf '[%s]\n%s = %s\n' "$1" "$2" "$3"; shift 3; done
  } > "$f"
}

# refused NAME SECTION OPTION VALUE: both tools refuse, with the same errors,
# and the daemon leaves nothing behind.
refused() {
  local name=$1 dir=$T/$1
  mkdir -p "$dir"
  conf "$dir/k.conf" "$dir" "$2" "$3" "$4"
  expect_exit 1 "$name: kvctl check-config refuses it" "$KVCTL" check-config "$dir/k.conf"
  sed -n "s|^kvctl: $dir/k.conf: error: ||p" "$T/err" | sort > "$dir/kvctl.err"
  check "$name: kvctl names $2.$3" grep -q "$2\.$3\|$3" "$dir/kvctl.err"
  # (A daemon that starts instead is stopped after 20 s: a failure, not a hang.)
  expect_exit 2 "$name: kvcached refuses to start" timeout 20 "$BIN/kvcached" --config "$dir/k.conf"
  sed -n 's/^[^ ]* error config: //p' "$T/err" | grep -v '^configuration refused: not starting$' \
    | sort > "$dir/daemon.err"
  if [ -s "$dir/kvctl.err" ] && cmp -s "$dir/kvctl.err" "$dir/daemon.err"; then
    ok "$name: the same messages from both"
  else
    bad "$name: messages differ: kvctl [$(cat "$dir/kvctl.err")] kvcached [$(cat "$dir/daemon.err")]"
  fi
  grep -q "configuration refused: not starting" "$T/err" && ok "$name: the daemon says it does not start" \
    || bad "$name: daemon stderr: $(cat "$T/err")"
  check "$name: no socket directory made" test ! -e "$dir/run"
  check "$name: no G3 directory made" test ! -e "$dir/g3"
}

refused queue_depth g3 queue_depth 1000000
refused block_bytes_zero g3 block_bytes 0
refused block_bytes_over_capacity g3 block_bytes 16M
refused block_bytes_no_slot g3 block_bytes 7M     # 1 MiB of header + 4 KiB + 7 MiB > 8M
refused admin_group admin group no-such-group-kvtest
refused g2_over_memory g2 capacity "$over_mem"
# 93 bytes: fits the option, but not "/kvcached-stats.sock" after it in sun_path.
refused socket_dir_too_long daemon socket_dir "/tmp/$(printf 'd%.0s' {1..88})"

# G3 trouble the daemon survives is a warning, not a refusal: kvcached runs
# on G2 alone and retries (tests/integration/test_daemon_g3.c starts one that way).
warned() {
  local name=$1 dir=$T/$1
  mkdir -p "$dir"
  conf "$dir/k.conf" "$dir" "$2" "$3" "$4"
  expect_exit 0 "$name: kvctl check-config passes it" "$KVCTL" check-config "$dir/k.conf"
  check "$name: with a warning on $2.$3 saying G2 runs alone" \
    grep -q "warning: g3.*G2 alone" "$T/err"
}
warned g3_over_filesystem g3 capacity 100000T
warned g3_parent_missing g3 path "$T/g3_parent_missing/nothere/g3"

# The machine's checks can be left out, for a file meant for another machine.
conf "$T/big.conf" "$T/big" g2 capacity "$over_mem"
expect_exit 0 "check-config --no-machine passes G2 above this machine's memory" \
  "$KVCTL" check-config --no-machine "$T/big.conf"
expect_exit 1 "but not the configuration's own errors" \
  "$KVCTL" check-config --no-machine "$T/queue_depth/k.conf"
expect_exit 2 "check-config takes one FILE" "$KVCTL" check-config "$T/big.conf" "$T/big.conf"
expect_exit 2 "check-config refuses an unknown option" "$KVCTL" check-config --frob "$T/big.conf"

# A warning is not a refusal: with g2.lock and RLIMIT_MEMLOCK below
# g2.capacity (CAP_IPC_LOCK dropped), G2 runs unlocked, as the daemon does.
mkdir -p "$T/lock"
conf "$T/lock/k.conf" "$T/lock" g2 lock yes
NOLOCK=(prlimit --memlock=65536)
[ "$(id -u)" -eq 0 ] && NOLOCK=(setpriv --inh-caps -ipc_lock --bounding-set -ipc_lock "${NOLOCK[@]}")
if command -v prlimit >/dev/null && command -v setpriv >/dev/null && "${NOLOCK[@]}" true 2>/dev/null; then
  expect_exit 0 "RLIMIT_MEMLOCK below g2.capacity is a warning, not a refusal" "${NOLOCK[@]}" "$KVCTL" check-config "$T/lock/k.conf"
  grep -q "warning: g2.lock: RLIMIT_MEMLOCK is 64.0 KiB, below g2.capacity (16.0 MiB): G2 will run unlocked" "$T/err" \
    && ok "and says why" || bad "memlock warning: $(cat "$T/err")"
  grep -q "ok, with 1 warning" "$T/out" && ok "ok, with the warning counted" || bad "memlock summary: $(cat "$T/out")"
  "${NOLOCK[@]}" "$BIN/kvcached" --config "$T/lock/k.conf" 2> "$T/lock/log" &
  pid=$!
  PIDS+=("$pid")
  if wait_for "$T/lock/log" "ready: socket" 10; then ok "the daemon starts with that warning"; else bad "daemon with low memlock: $(cat "$T/lock/log")"; fi
  grep -q "warn config: g2.lock: RLIMIT_MEMLOCK is 64.0 KiB" "$T/lock/log" && ok "and logs the same warning" \
    || bad "daemon memlock warning: $(cat "$T/lock/log")"
  if ldd "$BIN/kvcached" | grep -qE 'lib[at]san'; then
    echo "# ASan and TSan make mlock a no-op that succeeds: G2's lock state not checked"
  else
    grep -q "(not locked)" "$T/lock/log" && ok "and runs G2 unlocked" || bad "daemon lock state: $(cat "$T/lock/log")"
  fi
  kill -TERM "$pid"
  wait "$pid"
else
  echo "# prlimit/setpriv unavailable: RLIMIT_MEMLOCK case not run"
fi
finish
