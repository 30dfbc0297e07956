#!/usr/bin/env bash
# daemon_lifecycle.sh - kvcached's start-up, flags, configuration errors,
# SIGHUP reload and clean SIGTERM stop, as an operator meets them.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "--version" "$BIN/kvcached" --version
grep -q '^kvcached [0-9]' "$T/out" && ok "version printed" || bad "version printed"
expect_exit 0 "--help" "$BIN/kvcached" --help
expect_exit 2 "unknown flag is a usage error" "$BIN/kvcached" --no-such-flag
expect_exit 2 "bad size is refused" "$BIN/kvcached" --g2-capacity 12Q
grep -q "g2.capacity" "$T/err" && ok "bad size names the option" || bad "bad size names the option"
expect_exit 2 "unknown policy is refused" "$BIN/kvcached" --policy nope
printf '[g2]\ncapacity = 8M\nbogus = 1\n' > "$T/bad.conf"
expect_exit 1 "unknown option in the file is refused" "$BIN/kvcached" --config "$T/bad.conf"
grep -q "bad.conf:3:.*bogus" "$T/err" && ok "file error names file, line and option" || bad "file error names file, line and option: $(cat "$T/err")"
expect_exit 1 "missing config file is refused" "$BIN/kvcached" --config "$T/none.conf"

# --print-config round-trips through kvctl check-config.
"$BIN/kvcached" --print-config --g2-capacity 16M > "$T/printed.conf"
expect_exit 0 "printed configuration is valid" "$BIN/kvctl" check-config "$T/printed.conf"
grep -q "^capacity = 16777216$" "$T/printed.conf" && ok "flags override defaults" || bad "flags override defaults"
expect_exit 0 "shipped default configuration is valid" "$BIN/kvctl" check-config "$SRC/deploy/kvcached.conf"
expect_exit 1 "kvctl check-config reports a bad file" "$BIN/kvctl" check-config "$T/bad.conf"
expect_exit 2 "kvctl without a command is a usage error" "$BIN/kvctl"
expect_exit 2 "kvctl unknown command is a usage error" "$BIN/kvctl" frobnicate

# A real start, reload and stop.
printf '[g2]\ncapacity = 16M\npage_size = 4M\n[log]\nlevel = info\n' > "$T/k.conf"
"$BIN/kvcached" --config "$T/k.conf" --socket-dir "$T/run" --g3-path "$T/g3" --g3-capacity 8M --foreground 2> "$T/log" &
pid=$!
PIDS+=("$pid")
if wait_for "$T/log" "ready: socket $T/run/kvcached.sock, G2 16777216 bytes" 10; then ok "daemon reports ready with its socket and G2"; else bad "daemon ready: $(cat "$T/log")"; fi
check "the socket is there, mode 0660" test "$(stat -c %a "$T/run/kvcached.sock")" = 660
check "its directory is 0750" test "$(stat -c %a "$T/run")" = 750
# A second daemon on the same socket directory is refused, the first unharmed.
expect_exit 1 "a second daemon on the same socket is refused" "$BIN/kvcached" --config "$T/k.conf" --socket-dir "$T/run" --g3-path ""
grep -q "another kvcached is serving it" "$T/err" && ok "and says why" || bad "second daemon message: $(cat "$T/err")"
grep -q "G1" "$T/log" && ok "daemon says whether G1 is available" || bad "G1 status logged"
printf '[g2]\ncapacity = 16M\npage_size = 4M\n[log]\nlevel = debug\n' > "$T/k.conf"
kill -HUP "$pid"
if wait_for "$T/log" "configuration re-read (log.level=debug)" 5; then ok "SIGHUP re-reads the file"; else bad "SIGHUP reload"; fi
printf '[g2]\ncapacity = lots\n' > "$T/k.conf"
kill -HUP "$pid"
if wait_for "$T/log" "keeping the running configuration" 5; then ok "a bad file on SIGHUP keeps the running configuration"; else bad "bad reload kept running config"; fi
kill -0 "$pid" 2>/dev/null && ok "still running after a bad reload" || bad "still running after a bad reload"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] && ok "SIGTERM exits 0" || bad "SIGTERM exit status $rc"
grep -q "stopped cleanly" "$T/log" && ok "clean stop logged" || bad "clean stop logged"
grep -q "index synced and closed" "$T/log" && ok "the G3 index is synced on SIGTERM" || bad "G3 index sync on stop: $(cat "$T/log")"
check "the socket file is removed on stop" test ! -e "$T/run/kvcached.sock"

# An arena too large to create is a start-up failure with a message. (A
# size beyond the machine's memory is refused by the configuration checks
# before any arena is made: config_check.sh. Here the memfd cannot grow
# past RLIMIT_FSIZE, with SIGXFSZ ignored so that ftruncate fails EFBIG.)
expect_exit 1 "an impossible G2 size fails at start-up" \
  bash -c 'trap "" XFSZ; ulimit -f 1024; exec "$@"' - "$BIN/kvcached" --g2-capacity 16M --set g2.lock=no --socket-dir "$T/run2" --g3-path ""
grep -q "cannot create the G2 arena" "$T/err" && ok "start-up failure explained" || bad "start-up failure explained: $(cat "$T/err")"
finish
