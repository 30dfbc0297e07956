#!/usr/bin/env bash
# man_pages.sh - the manual pages of docs/man/ say what the programs do:
# kvcached.conf(5) has every option of the daemon's table under its
# section, with the default `kvcached --help` prints, and no option the
# daemon lacks; kvcached(8) has every flag of `kvcached --help`; kvctl(1)
# every command and option of `kvctl --help` and none it lacks; kvbench(1)
# every command of `kvbench --help` and only options its commands take.
# Every page names the daemon's version and renders without a warning
# (groff -ww), and cmake/Packaging.cmake installs each.
source "$(dirname "$0")/lib.bash"

MAN=$SRC/docs/man
for p in kvcached kvctl kvbench; do
  [ -x "$BIN/$p" ] || { echo "skipped: $BIN/$p not built"; exit 77; }
done
PAGES=(kvcached.8 kvcached.conf.5 kvctl.1 kvbench.1)

# plain FILE: roff source as text: escapes of hyphen, font and backslash
# undone, requests' names and quotes dropped.
plain() {
  sed -e 's/\\-/-/g; s/\\f[BIRP]//g; s/\\(aq/'"'"'/g; s/\\e/\\/g; s/\\&//g' \
      -e 's/^\.\(B\|I\|BR\|RB\|BI\|IB\|IR\|RI\) //; s/"//g' "$1"
}
# tags FILE: the tag line of each .TP entry, as text.
tags() { plain "$1" | awk 'tp { print; tp = 0 } /^\.TP/ { tp = 1 }'; }

version=$("$BIN/kvcached" --version | awk '{ print $2 }')
for page in "${PAGES[@]}"; do
  check "$page exists" test -f "$MAN/$page"
  grep -q "^\.TH [^ ]* [0-9] [^ ]* \"kvcached $version\"" "$MAN/$page" \
    && ok "$page names kvcached $version" || bad "$page: .TH does not name kvcached $version"
  sed -n 's/^set(KV_MAN_PAGES \(.*\))$/\1/p' "$SRC/cmake/Packaging.cmake" | tr ' ' '\n' \
    | grep -qxF "$page" && ok "$page is installed (cmake/Packaging.cmake)" \
    || bad "$page is not in KV_MAN_PAGES"
done
if command -v groff >/dev/null; then
  for page in "${PAGES[@]}"; do
    LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$MAN/$page" >"$T/groff" 2>&1
    [ ! -s "$T/groff" ] && ok "$page renders without a warning" \
      || bad "$page: $(head -5 "$T/groff")"
  done
else
  echo "skip - rendering: groff not found (apt-get install groff-base)"
fi

# --- kvcached.conf(5) against the option table ----------------------------------------
# `kvcached --help`: "  --SECTION.NAME=VALUE[, --alias]" then a line ending
# in "(default: X)" ('' for an empty default).
"$BIN/kvcached" --help > "$T/kvd_help"
awk '/^  --[a-z0-9_]+\.[a-z0-9_]+=/ { split(substr($1, 3), a, "="); opt = a[1]; next }
     opt && /\(default: / { d = $0; sub(/.*\(default: /, "", d); sub(/\)$/, "", d);
                            if (d == "'"''"'") d = ""; line = opt " = " d; sub(/ +$/, "", line);
                            print line; opt = "" }' \
  "$T/kvd_help" | sort > "$T/help_opts"
check "kvcached --help lists the option table (40 or more)" test "$(wc -l < "$T/help_opts")" -ge 40
# the page: ".SS [SECTION]" then ".TP" / ".B NAME = DEFAULT"
plain "$MAN/kvcached.conf.5" | awk '/^\.SS \[/ { s = $2; gsub(/[][]/, "", s); next }
  /^\.SH/ { s = "" } tp && s { sub(/ +$/, ""); print s "." $0 } { tp = /^\.TP/ }' \
  | sort > "$T/man_opts"
missing=$(comm -23 "$T/help_opts" "$T/man_opts" | tr '\n' ';')
extra=$(comm -13 "$T/help_opts" "$T/man_opts" | tr '\n' ';')
n=$(wc -l < "$T/help_opts")
[ -z "$missing" ] && ok "kvcached.conf(5) has every option with its default ($n)" \
  || bad "kvcached.conf(5) lacks, or gives another default for: $missing"
[ -z "$extra" ] && ok "kvcached.conf(5) has no option the daemon lacks" \
  || bad "kvcached.conf(5) has options not in kvcached --help: $extra"
for key in uids gids g2_share g3_share cold_precision; do
  grep -q "$key" "$SRC/daemon/config.c" && tags "$MAN/kvcached.conf.5" | grep -qx "$key" \
    && ok "kvcached.conf(5) has the tenant key $key" || bad "tenant key $key"
done

# --- kvcached(8) against its flags ----------------------------------------------------------
# Flags without a dot (the fixed ones and the older spellings); those with
# one (--SECTION.NAME) are options of the table. "--section.name" is the
# page's placeholder, "--now" systemctl's.
flags() { grep -oE -- '--[a-z][a-z0-9_.-]*' | grep -v '\.' | sort -u; }
flags < "$T/kvd_help" > "$T/kvd_flags"
plain "$MAN/kvcached.8" | flags > "$T/kvd_man_flags"
missing=$(comm -23 "$T/kvd_flags" "$T/kvd_man_flags" | tr '\n' ' ')
extra=$(comm -13 "$T/kvd_flags" "$T/kvd_man_flags" | grep -vx -- '--now' | tr '\n' ' ')
[ -z "$missing" ] && ok "kvcached(8) has every flag ($(wc -l < "$T/kvd_flags"))" \
  || bad "kvcached(8) lacks $missing"
[ -z "$extra" ] && ok "kvcached(8) has no flag the daemon lacks" || bad "kvcached(8) names $extra"
cut -d' ' -f1 "$T/help_opts" | sed 's/^/--/' > "$T/kvd_dotted"
echo "--section.name" >> "$T/kvd_dotted"
extra=$(plain "$MAN/kvcached.8" | grep -oE -- '--[a-z0-9_]+\.[a-z0-9_]+' | sort -u \
        | grep -vxF -f "$T/kvd_dotted" | tr '\n' ' ')
[ -z "$extra" ] && ok "kvcached(8) names only options of the table" \
  || bad "kvcached(8) names $extra"
for f in -c -o -V -h; do
  plain "$MAN/kvcached.8" | tr -d ' ' | grep -q -- "$f,--" && ok "kvcached(8) has $f" \
    || bad "kvcached(8) lacks $f"
done

# --- kvctl(1) against kvctl --help ----------------------------------------------------------
"$BIN/kvctl" --help > "$T/ctl_help" 2>&1
# commands: the first word of the two-space-indented lines before "connection:"
sed '/^connection:/,$d' "$T/ctl_help" | sed -n 's/^  \([a-z][a-z0-9-]*\)\( .*\)\?$/\1/p' \
  | sort -u > "$T/ctl_cmds"
tags "$MAN/kvctl.1" | awk '{ print $1 }' | sort -u > "$T/ctl_man_tags"
check "kvctl --help lists 15 or more commands" test "$(wc -l < "$T/ctl_cmds")" -ge 15
missing=$(comm -23 "$T/ctl_cmds" "$T/ctl_man_tags" | tr '\n' ' ')
[ -z "$missing" ] && ok "kvctl(1) has every command ($(wc -l < "$T/ctl_cmds"))" \
  || bad "kvctl(1) lacks the commands $missing"
grep -oE -- '--[a-z][a-z0-9-]*' "$T/ctl_help" | sort -u > "$T/ctl_opts"
plain "$MAN/kvctl.1" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u > "$T/ctl_man_opts"
missing=$(comm -23 "$T/ctl_opts" "$T/ctl_man_opts" | tr '\n' ' ')
extra=$(comm -13 "$T/ctl_opts" "$T/ctl_man_opts" | tr '\n' ' ')
[ -z "$missing" ] && ok "kvctl(1) has every option ($(wc -l < "$T/ctl_opts"))" \
  || bad "kvctl(1) lacks $missing"
[ -z "$extra" ] && ok "kvctl(1) has no option kvctl lacks" || bad "kvctl(1) names $extra"
sed -n 's/^  *\(-[a-z]\), \(--[a-z-]*\).*/\1,\2/p' "$T/ctl_help" > "$T/ctl_short"
while read -r pair; do
  plain "$MAN/kvctl.1" | tr -d ' ' | grep -qF -- "$pair" && ok "kvctl(1) has $pair" \
    || bad "kvctl(1) lacks $pair"
done < "$T/ctl_short"

# --- kvbench(1) against kvbench --help ------------------------------------------------------
"$BIN/kvbench" --help > "$T/bench_help" 2>&1
sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p' "$T/bench_help" | sort -u > "$T/bench_cmds"
check "kvbench --help lists its commands" test "$(wc -l < "$T/bench_cmds")" -ge 8
tags "$MAN/kvbench.1" | awk '{ print $1 }' | sort -u > "$T/bench_man_tags"
missing=$(comm -23 "$T/bench_cmds" "$T/bench_man_tags" | tr '\n' ' ')
[ -z "$missing" ] && ok "kvbench(1) has every command ($(wc -l < "$T/bench_cmds"))" \
  || bad "kvbench(1) lacks $missing"
: > "$T/bench_all"
while read -r c; do
  "$BIN/kvbench" "$c" --help </dev/null >> "$T/bench_all" 2>&1
done < "$T/bench_cmds"
{ grep -oE -- '--[a-z][a-z0-9-]*' "$T/bench_all"; echo --help; } | sort -u > "$T/bench_opts"
plain "$MAN/kvbench.1" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u > "$T/bench_man_opts"
extra=$(comm -13 "$T/bench_opts" "$T/bench_man_opts" | tr '\n' ' ')
[ -z "$extra" ] && ok "kvbench(1) names only options its commands take" \
  || bad "kvbench(1) names $extra"
finish
