# lib.bash - helpers for the shell-level tests (sourced, not run).
# Each test gets BIN (the build's bin directory) and SRC (the source tree)
# as $1 and $2, a private temporary directory in $T (removed on exit), and
# prints "N passed, N failed" at the end.
set -u
BIN=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
T=$(mktemp -d /tmp/kvtest.XXXXXX)
PASS=0
FAIL=0
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

ok()   { PASS=$((PASS + 1)); echo "ok   - $*"; }
bad()  { FAIL=$((FAIL + 1)); echo "FAIL - $*"; }
check() { # check "description" command...
  local d=$1; shift
  if "$@"; then ok "$d"; else bad "$d"; fi
}
# expect_exit CODE "description" command... : runs the command, wants CODE.
expect_exit() {
  local want=$1 d=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  if [ "$got" -eq "$want" ]; then ok "$d"; else bad "$d (exit $got, wanted $want; stderr: $(head -c 300 "$T/err"))"; fi
}
# wait_for FILE PATTERN SECONDS
wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ]
}

# mooncake_trace: prints the path of the Mooncake trace in the tree
# (bench/traces), or, when there is none, of a small trace of the same
# format with shared prefixes, generated into $T (and says so on stderr).
mooncake_trace() {
  local shared="$SRC/bench/traces/mooncake_synthetic_trace.jsonl"
  if [ -r "$shared" ]; then echo "$shared"; return; fi
  awk 'BEGIN { srand(3); id = 0;
    for (r = 0; r < 800; r++) {
      n = 4 + int(rand() * 12); root = int(rand() * 20) * 1000;
      s = "";
      for (i = 0; i < n; i++) { v = (i < 3) ? root + i : 100000 + id++; s = s (i ? ", " : "") v }
      printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 1, \"hash_ids\": [%s]}\n", r * 10, n * 512 - 100, s
    } }' > "$T/trace.jsonl"
  echo "# shared trace not found; using a generated one" >&2
  echo "$T/trace.jsonl"
}
