#!/usr/bin/env bash
# outside_paths.sh - no tracked file names a path outside the repository
# (tools/dev/outside_paths.sh): the tree passes, and a copy of it fails,
# naming the file and the line, with any one of these planted: a link in
# the README beside the checkout, a doc in a folder naming a trace beside
# it, a script climbing from its own folder or from the root's variable, a
# C comment and an #include climbing out, a home directory, the work
# folder and root's home in scripts and manifests, the checkout's own
# absolute path, a symbolic link out of the tree. The system paths a
# deployment uses, climbs that stay inside, and prose ranges still pass.
#
# The planted paths are put together from variables ($up, $hm, ...) so that
# this file itself names none of them.
source "$(dirname "$0")/lib.bash"

CHECK=$SRC/tools/dev/outside_paths.sh
if ! command -v git >/dev/null; then
  echo "skipped: git is not installed (the check reads git ls-files)"
  exit 77
fi
top=$(git -C "$SRC" rev-parse --show-toplevel 2>/dev/null)
if [ -z "$top" ] || [ "$(cd "$top" && pwd -P)" != "$(cd "$SRC" && pwd -P)" ]; then
  echo "skipped: $SRC is not the top of a git checkout (the check reads git ls-files)"
  exit 77
fi

expect_exit 0 "no tracked file names a path outside the repository" bash "$CHECK" "$SRC"
sed 's/^/    /' "$T/out"

# A copy of the tracked files, as a git checkout of its own.
TREE=$T/tree
mkdir -p "$TREE"
(cd "$SRC" && git ls-files -z | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
  tar -xf - -C "$TREE" || exit 1
git -C "$TREE" -c init.defaultBranch=main init -q && git -C "$TREE" add -A || exit 1
expect_exit 0 "the copy passes" bash "$CHECK" "$TREE"

up=..
hm=home
wk=work
rt=root

# append FILE TEXT: TEXT becomes FILE's last line; prints that line's number.
append() {
  local f=$TREE/$1
  [ -n "$(tail -c1 "$f")" ] && echo >>"$f"
  printf '%s\n' "$2" >>"$f"
  wc -l <"$f"
}
restore() { git -C "$TREE" checkout -q -- .; }

# refused "description" FILE TEXT: the check fails and names FILE:LINE.
refused() {
  local n
  n=$(append "$2" "$3")
  expect_exit 1 "$1 is refused" bash "$CHECK" "$TREE"
  check "  and the report names $2:$n" grep -q "^$2:$n: " "$T/out"
  restore
}
# passes "description" FILE TEXT: the check still passes.
passes() {
  append "$2" "$3" >/dev/null
  expect_exit 0 "$1 passes" bash "$CHECK" "$TREE"
  [ -s "$T/out" ] && sed 's/^/    /' "$T/out"
  restore
}

refused "a README link beside the checkout" README.md \
  "See [the design]($up/shared/DESIGN.md)."
refused "a doc in daemon/ naming a trace beside the checkout" daemon/OPS.md \
  "Replay \`$up/shared/data/x.jsonl\` to see it."
refused "a script reading beside the checkout from its own folder" tools/bench/lib.sh \
  "trace=\"\$(dirname \"\${BASH_SOURCE[0]}\")/$up/$up/shared/data/x\""
refused "a script climbing out of its own folder" tools/bench/g3_sanitize.sh \
  "data=\"\$(dirname \"\$0\")/$up/$up/$up/data\""
refused "a test climbing out from the source root's variable" tests/sh/kvctl.sh \
  "cp \"\$SRC/$up/shared/x\" \"\$T\""
refused "a C comment climbing out" base/buf.c \
  "/* tables from $up/$up/$up/gen/tables.txt */"
refused "a C #include climbing out" tests/unit/test_config.c \
  "#include \"$up/$up/$up/include/x.h\""
refused "a Markdown link climbing out of a sub-folder" client/python/README.md \
  "[notes]($up/$up/$up/notes/README.md)"
refused "a home directory in a script" tools/bench/compare.sh \
  "out=/$hm/dev/kvcached/results"
refused "the work folder in a Python comment" client/python/kvclient/_lib.py \
  "# built in /$wk/main/build"
refused "root's home in a manifest" deploy/k8s/kvcached-daemonset.yaml \
  "# path: /$rt/.cache/kvcached"
refused "the checkout's own absolute path" BENCHMARKS.md \
  "Built in $(cd "$TREE" && pwd -P)/build."
refused "a file URL into a home directory" tiers/G3.md \
  "See <file:///$hm/dev/notes.md>."

ln -s "$up/$up/shared/x" "$TREE/tools/shared_data" && git -C "$TREE" add tools/shared_data
expect_exit 1 "a symbolic link out of the tree is refused" bash "$CHECK" "$TREE"
check "  and the report names it" grep -q "^tools/shared_data: " "$T/out"
git -C "$TREE" rm -q --cached tools/shared_data && rm -f "$TREE/tools/shared_data"
ln -s /etc/kvcached "$TREE/tools/etc_link" && git -C "$TREE" add tools/etc_link
expect_exit 1 "a symbolic link to an absolute path is refused" bash "$CHECK" "$TREE"
check "  and the report names it" grep -q "^tools/etc_link: " "$T/out"
git -C "$TREE" rm -q --cached tools/etc_link && rm -f "$TREE/tools/etc_link"

passes "the system paths a deployment uses" README.md \
  "/etc/kvcached/kvcached.conf, /run/kvcached, /var/lib/kvcached, /opt/kvcached-deps, \
~/.cache/kvcached-deps, /usr/local/cuda, /tmp/kv.XXXXXX, /dev/shm, /proc/meminfo, /mnt/nvme0/kv"
passes "a script's climb to the root from its own folder" tools/bench/lib.sh \
  "root=\$(cd \"\$(dirname \"\${BASH_SOURCE[0]}\")\"/$up/$up && pwd)"
passes "an #include of a neighbour folder" tests/unit/test_config.c \
  "#include \"$up/fuzz/samples.h\""
passes "a Markdown link up to the README" client/python/README.md \
  "[the top]($up/$up/README.md)"
passes "a glob in a neighbour folder" tests/unit/test_config.c \
  "/* $up/fuzz/*.c and $up/fuzz/seed\$N.bin */"
passes "ranges, an ellipsis and a web address" daemon/OPS.md \
  "Blocks 1 .. n ... see https://example.com/$hm/x and http://127.0.0.1:9464/$wk/metrics."
expect_exit 0 "the copy passes again once restored" bash "$CHECK" "$TREE"
finish
