#!/usr/bin/env bash
# config_flags.sh - kvcached's command line, generated from the option
# table: every option as --SECTION.NAME=VALUE (or VALUE as the next word),
# the older spellings, --set and a configuration file all give the same
# configuration; --help lists every option; an enum option refuses a word
# outside its names with the list, from a flag, a file or kvctl check-config.
source "$(dirname "$0")/lib.bash"

KVD=$BIN/kvcached

# printed NAME ARGS...: kvcached --print-config ARGS into $T/NAME.
printed() {
  local name=$1
  shift
  if "$KVD" --print-config "$@" > "$T/$name" 2> "$T/$name.err"; then ok "$name: read"
  else bad "$name: exit $?: $(cat "$T/$name.err")"; fi
}

cat > "$T/k.conf" <<CONF
[daemon]
socket_dir = $T/run
[g2]
capacity = 256M
lock = no
[g3]
path = $T/g3
admit = min-prio
backend = threads
[g1]
enable = off
backend = sim
[log]
level = warning
[cache]
policy = lru2
CONF
printed file -c "$T/k.conf"
printed set --set "daemon.socket_dir=$T/run" --set g2.capacity=256M --set g2.lock=no --set "g3.path=$T/g3" \
  --set g3.admit=min-prio --set g3.backend=threads --set g1.enable=off --set g1.backend=sim \
  --set log.level=warning --set cache.policy=lru2
printed flags_eq "--daemon.socket_dir=$T/run" --g2.capacity=256M --g2.lock=no "--g3.path=$T/g3" \
  --g3.admit=min-prio --g3.backend=threads --g1.enable=off --g1.backend=sim --log.level=warning \
  --cache.policy=lru2
printed flags_sep --daemon.socket_dir "$T/run" --g2.capacity 256M --g2.lock no --g3.path "$T/g3" \
  --g3.admit min-prio --g3.backend threads --g1.enable off --g1.backend sim --log.level warning \
  --cache.policy lru2
printed older --socket-dir "$T/run" --g2-capacity 256M --g2.lock=no --g3-path "$T/g3" --g3.admit=min-prio \
  --g3.backend=threads --g1.enable=off --g1.backend=sim --log-level warning --policy lru2
grep -q "^admit = min-prio$" "$T/file" && grep -q "^level = warn$" "$T/file" \
  && ok "enum options print their names" || bad "print-config: $(grep -E '^(admit|level) =' "$T/file")"
for v in set flags_eq flags_sep older; do
  check "$v: the same configuration as the file" cmp -s "$T/file" "$T/$v"
done

# Flags override the file wherever they stand; -c in each of its forms.
printed after -c "$T/k.conf" --g3.admit=always
printed before --g3.admit always "-c$T/k.conf"
printed long --g3.admit=always --config "$T/k.conf"
printed long_eq "--config=$T/k.conf" --g3.admit=always
sed 's/^admit = min-prio$/admit = always/' "$T/file" > "$T/want"
for v in after before long long_eq; do
  check "$v: the flag over the file" cmp -s "$T/want" "$T/$v"
done

# --help: every option --print-config prints, as --SECTION.NAME=.
"$KVD" --help > "$T/help"
missing=$(awk '/^\[/ { s = substr($0, 2, length($0) - 2) } /^[a-z_0-9]+ = / { print "--" s "." $1 "=" }' "$T/file" |
  while read -r f; do grep -qF -- "  $f" "$T/help" || echo "$f"; done)
n=$(grep -c '^  --[a-z0-9_]*\.[a-z0-9_]*=' "$T/help")
[ -z "$missing" ] && [ "$n" -ge 30 ] && ok "--help lists all $n options" || bad "--help lacks: $missing"
grep -q -- "--g3.admit=always|second-use|min-prio" "$T/help" && ok "--help lists an enum's names" \
  || bad "--help: $(grep -- --g3.admit "$T/help")"

# A word outside an enum's names.
expect_exit 2 "a bad enum flag is bad usage" "$KVD" --print-config --g1.enable=maybe
grep -q "g1.enable: 'maybe': expected one of: auto, on, off" "$T/err" && ok "and lists the names" \
  || bad "flag: $(cat "$T/err")"
expect_exit 2 "through --set too" "$KVD" --print-config --set log.level=chatty
grep -q "log.level: 'chatty': expected one of: debug, info, warn, error" "$T/err" && ok "with the same list" \
  || bad "--set: $(cat "$T/err")"
printf '[g3]\nbackend = spdk\n' > "$T/bad.conf"
expect_exit 1 "in a file, kvcached cannot read it" "$KVD" --print-config -c "$T/bad.conf"
grep -q "bad.conf:2: g3.backend: 'spdk': expected one of: auto, uring, threads" "$T/err" \
  && ok "and names the line" || bad "file: $(cat "$T/err")"
expect_exit 1 "kvctl check-config refuses it" "$BIN/kvctl" check-config --no-machine "$T/bad.conf"
grep -q "bad.conf:2: g3.backend: 'spdk': expected one of: auto, uring, threads" "$T/err" \
  && ok "with the same message" || bad "kvctl: $(cat "$T/err")"
finish
