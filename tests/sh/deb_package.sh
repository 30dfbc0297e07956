#!/usr/bin/env bash
# deb_package.sh - the Debian packages (cmake/Packaging.cmake) build,
# install, work and purge without a trace. From a build of its own
# (prefix /usr, Release, no tests, no CUDA) `cpack -G DEB` makes kvcached,
# libkvclient0 and libkvclient-dev, each holding its own files only (the
# Python wheel's none), with shared-library dependencies from
# dpkg-shlibdeps. Installed on this machine with dpkg (and installed again,
# as an upgrade does): the programs in /usr/bin run, the installed daemon
# serves a block as user kvcached on the packaged configuration, the unit
# passes `systemd-analyze verify` and runs /usr/bin/kvcached, the user and
# group exist, the manual pages resolve, and a C program builds and runs
# against the installed library through pkg-config and through the CMake
# package (kvclient::kvclient, kvclient::kvclient_static). Purged, nothing
# of them is left: no file, /etc/kvcached, /var/lib/kvcached, user or group.
# postinst's other way to the account (adduser, where systemd-sysusers is
# missing) makes a user that postrm removes as well.
#
# Needs root and dpkg. It changes the machine: it refuses (skips) where a
# kvcached it did not install is there (the user, /etc/kvcached,
# /var/lib/kvcached, /usr/bin/kvcached), purges packages an earlier run
# left installed, holds a lock so that two runs never overlap, and on any
# exit leaves the machine as it found it (purged; no user, group,
# /etc/kvcached or /var/lib/kvcached). Other tests run build/bin's
# programs, never /usr/bin's. KV_DEB_BUILD_DIR=DIR builds in DIR, kept
# between runs (below).
source "$(dirname "$0")/lib.bash"
export PATH=$PATH:/usr/sbin:/sbin
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH

PKGS=(kvcached libkvclient0 libkvclient-dev)
GECOS="kvcached tiered KV-cache daemon"   # deploy/systemd/kvcached.sysusers

# --- can it run here ------------------------------------------------------------------------
if [ "$(id -u)" -ne 0 ]; then echo "skipped: installs packages, needs root"; exit 77; fi
for tool in dpkg dpkg-deb dpkg-query dpkg-shlibdeps cmake cpack cc pkg-config flock setpriv file; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: $tool not found (deploy/install-deps.sh)"; exit 77
  fi
done

# state PKG: dpkg's status word for PKG (installed, config-files, ...), or
# nothing when dpkg does not know it.
state() { dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null; }
ours_present() {
  local p s
  for p in "${PKGS[@]}"; do
    s=$(state "$p")
    [ -n "$s" ] && [ "$s" != not-installed ] && return 0
  done
  return 1
}
purge_ours() { ours_present && dpkg --purge "${PKGS[@]}" >>"$T/purge_trap.log" 2>&1; }

# One run at a time on this machine (dpkg's own lock would fail the second).
LOCKDIR=/run/lock
[ -d "$LOCKDIR" ] || LOCKDIR=/tmp
exec 9>"$LOCKDIR/kvcached-deb_package.lock"
flock -w 240 9 || { echo "skipped: another deb_package.sh holds the lock for 4 minutes"; exit 77; }

if ours_present; then
  echo "# an earlier run left packages installed: purging them first"
  if ! dpkg --purge "${PKGS[@]}" >"$T/purge0" 2>&1; then
    bad "purge of leftovers: $(tail -5 "$T/purge0")"; finish; exit
  fi
fi
for path in /etc/kvcached /var/lib/kvcached /usr/bin/kvcached /usr/bin/kvctl; do
  if [ -e "$path" ]; then
    echo "skipped: $path exists and is not the package's (an install by hand?)"; exit 77
  fi
done
if getent passwd kvcached >/dev/null || getent group kvcached >/dev/null; then
  echo "skipped: a user or group kvcached exists and is not the package's: purging would remove it"
  exit 77
fi
# None of it was there at the start: whatever of it is there at the end
# this run made (the packages, or a purge that failed to remove it), and
# goes, so that the next run finds the machine as this one did.
on_exit() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  purge_ours
  getent passwd kvcached >/dev/null && userdel kvcached 2>/dev/null
  getent group kvcached >/dev/null && groupdel kvcached 2>/dev/null
  rm -rf /etc/kvcached /var/lib/kvcached
  cleanup
}
trap on_exit EXIT
start=$SECONDS

# --- build the packages ---------------------------------------------------------------------
# KV_DEB_BUILD_DIR=DIR: build there (kept: a second run builds only what
# changed) instead of in the test's temporary directory.
B=${KV_DEB_BUILD_DIR:-$T/build}
rm -f "$B"/*.deb
if cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
     -DKV_TESTS=OFF -DKV_CUDA=OFF -DKV_DEB_RELEASE=1 >"$T/configure.log" 2>&1 \
   && cmake --build "$B" -j2 >"$T/build.log" 2>&1; then
  ok "configure and build, prefix /usr ($((SECONDS - start)) s)"
else
  bad "build: $(tail -20 "$T/configure.log" "$T/build.log")"; finish; exit
fi
t=$SECONDS
(cd "$B" && cpack -G DEB) >"$T/cpack.log" 2>&1 && ok "cpack -G DEB ($((SECONDS - t)) s)" \
  || { bad "cpack: $(tail -20 "$T/cpack.log")"; finish; exit; }
VERSION=$(sed -n 's/^project(kvcached VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
ARCH=$(dpkg --print-architecture)
declare -A DEB
for p in "${PKGS[@]}"; do
  DEB[$p]=$B/${p}_${VERSION}-1_${ARCH}.deb
  check "$(basename "${DEB[$p]}") is made" test -f "${DEB[$p]}"
  dpkg-deb -c "${DEB[$p]}" | awk '{ print $6 }' | sed 's|^\./|/|' > "$T/$p.files"
  dpkg-deb -f "${DEB[$p]}" Depends > "$T/$p.depends"
done
[ -f "${DEB[kvcached]}" ] && [ -f "${DEB[libkvclient0]}" ] && [ -f "${DEB[libkvclient-dev]}" ] \
  || { finish; exit; }

# has PKG PATTERN...: each (an anchored extended regex) is a file of PKG.
has() {
  local p=$1 f
  shift
  for f in "$@"; do
    grep -qE "^$f\$" "$T/$p.files" && ok "$p holds $f" || bad "$p lacks $f"
  done
}
UNIT_RE='(/usr)?/lib/systemd/system/kvcached\.service'
M=/usr/share/man
has kvcached /usr/bin/kvcached /usr/bin/kvctl /usr/bin/kvbench "$UNIT_RE" \
  /etc/kvcached/kvcached.conf /usr/lib/sysusers.d/kvcached.conf $M/man8/kvcached.8.gz \
  $M/man5/kvcached.conf.5.gz $M/man1/kvctl.1.gz $M/man1/kvbench.1.gz \
  /usr/share/doc/kvcached/README.md
L='/usr/lib/[^/]+'
has libkvclient0 "$L/libkvclient\\.so\\.0" "$L/libkvclient\\.so\\.${VERSION//./\\.}"
has libkvclient-dev /usr/include/kvclient.h "$L/libkvclient\\.a" "$L/libkvclient\\.so" \
  "$L/pkgconfig/kvclient\\.pc" "$L/cmake/kvclient/kvclientConfig\\.cmake" \
  "$L/cmake/kvclient/kvclientConfigVersion\\.cmake" "$L/cmake/kvclient/kvclientTargets\\.cmake"
check "the library's package holds no development file" \
  sh -c "! grep -qE '\\.(a|h|pc|cmake)\$|libkvclient\\.so\$' '$T/libkvclient0.files'"
check "the daemon's package holds no library" sh -c "! grep -q libkvclient '$T/kvcached.files'"
check "no package holds the Python wheel's files" sh -c "! grep -q 'kvclient/lib/' '$T'/*.files"
check "the manual pages are compressed" \
  sh -c "! grep -E '^/usr/share/man/man[0-9]/.' '$T/kvcached.files' | grep -qvE '\.gz\$|/\$'"
dpkg-deb --ctrl-tarfile "${DEB[kvcached]}" | tar -xO ./conffiles > "$T/conffiles" 2>/dev/null
check "/etc/kvcached/kvcached.conf is a conffile" \
  grep -qx /etc/kvcached/kvcached.conf "$T/conffiles"
check "kvcached depends on libc6 (dpkg-shlibdeps ran) and adduser" \
  sh -c "grep -q 'libc6 (>=' '$T/kvcached.depends' && grep -qw adduser '$T/kvcached.depends'"
check "libkvclient0 depends on libsodium23" grep -q 'libsodium23' "$T/libkvclient0.depends"
check "libkvclient-dev depends on libkvclient0 of its version, and libsodium-dev" \
  sh -c "grep -qF 'libkvclient0 (= ${VERSION}-1)' '$T/libkvclient-dev.depends' \
         && grep -q libsodium-dev '$T/libkvclient-dev.depends'"
echo "# kvcached depends on: $(cat "$T/kvcached.depends")"

# --- install ----------------------------------------------------------------------------------
t=$SECONDS
if dpkg -i "${DEB[@]}" >"$T/install.log" 2>&1; then ok "dpkg -i of the three ($((SECONDS - t)) s)"
else bad "dpkg -i: $(tail -20 "$T/install.log")"; finish; exit; fi
for p in "${PKGS[@]}"; do
  check "$p is installed" test "$(state "$p")" = installed
  dpkg -L "$p" > "$T/$p.installed"
done
UNIT=$(grep -E "^$UNIT_RE\$" "$T/kvcached.installed" | head -1)

# the account
pw=$(getent passwd kvcached)
check "user kvcached exists" test -n "$pw"
IFS=: read -r _ _ uid gid gecos home shell <<<"$pw"
check "user kvcached: a system uid ($uid)" test "${uid:-0}" -gt 0 -a "${uid:-1000}" -lt 1000
check "user kvcached: home /var/lib/kvcached, no login shell" \
  test "$home" = /var/lib/kvcached -a "$shell" = /usr/sbin/nologin
check "user kvcached: the package's comment field" test "${gecos%%,*}" = "$GECOS"
check "group kvcached exists and is the user's group" \
  test "$(getent group kvcached | cut -d: -f3)" = "$gid"

# the programs
expect_exit 0 "/usr/bin/kvcached --version" /usr/bin/kvcached --version
check "it prints kvcached $VERSION" grep -qx "kvcached $VERSION" "$T/out"
expect_exit 0 "/usr/bin/kvctl --help" /usr/bin/kvctl --help
check "kvctl --help prints the usage" grep -q '^usage: kvctl' "$T/out"
expect_exit 0 "/usr/bin/kvbench --help" /usr/bin/kvbench --help
expect_exit 0 "kvctl check-config --no-machine passes the packaged configuration" \
  /usr/bin/kvctl check-config --no-machine /etc/kvcached/kvcached.conf

# the unit
check "the unit is installed ($UNIT)" test -f "$UNIT"
grep -q "^ExecStart=/usr/bin/kvcached --config /etc/kvcached/kvcached.conf --foreground" "$UNIT" \
  && ok "the unit runs /usr/bin/kvcached on /etc/kvcached/kvcached.conf" \
  || bad "ExecStart: $(grep ExecStart "$UNIT")"
check "no /usr/local path left in the unit's settings" \
  sh -c "! grep -v '^#' '$UNIT' | grep -q /usr/local"
# A dpkg told to leave the manual pages out (path-exclude, as in some
# container images) installs none: verify's man: checks then fail, and the
# pages' checks are skipped.
NOMAN=0
grep -rqs 'path-exclude.*/usr/share/man' /etc/dpkg/dpkg.cfg.d && NOMAN=1
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$UNIT" >"$T/verify" 2>&1
  rc=$?
  [ "$NOMAN" = 1 ] && rc=0 && sed -i "/Command 'man /d" "$T/verify"
  [ "$rc" -eq 0 ] && ok "systemd-analyze verify of the installed unit" \
    || bad "verify exit $rc: $(cat "$T/verify")"
  if grep -q kvcached "$T/verify"; then bad "verify warns: $(grep kvcached "$T/verify")"
  else ok "verify prints no warning about the unit"; fi
else
  echo "skip - systemd-analyze not found (apt-get install systemd)"
fi

# the manual pages
if [ "$NOMAN" = 1 ]; then
  echo "skip - manual pages: this machine's dpkg leaves /usr/share/man out"
elif ! command -v man >/dev/null; then
  echo "skip - manual pages: man not found (apt-get install man-db)"
else
  for page in "8 kvcached" "5 kvcached.conf" "1 kvctl" "1 kvbench"; do
    set -- $page
    expect_exit 0 "man -w $1 $2" man -w "$1" "$2"
    check "man -w $1 $2 is the package's page" grep -qx "$M/man$1/$2.$1.gz" "$T/out"
  done
  MANWIDTH=80 man -P cat 5 kvcached.conf >"$T/man5" 2>/dev/null
  check "man kvcached.conf renders its options" grep -q 'socket_dir = /run/kvcached' "$T/man5"
fi

# the installed daemon, as the unit runs it: user kvcached, the packaged
# configuration; G3 in /var/lib/kvcached as StateDirectory= would make it;
# small tiers and its sockets in a directory of its own
install -d -o kvcached -g kvcached -m 0750 /var/lib/kvcached
chmod 0711 "$T"
RUN=$T/run
install -d -o kvcached -g kvcached -m 0750 "$RUN"
setpriv --reuid=kvcached --regid=kvcached --init-groups \
  /usr/bin/kvcached --config /etc/kvcached/kvcached.conf --foreground \
  --set "daemon.socket_dir=$RUN" --set g2.capacity=64M --set g2.lock=no --set g3.capacity=16M \
  --set g1.enable=off >"$T/kvd.log" 2>&1 &
KVD=$!
PIDS+=("$KVD")
if wait_for "$T/kvd.log" ' ready' 30; then ok "the installed daemon starts as user kvcached"
else bad "no ready line: $(tail -5 "$T/kvd.log")"; fi
expect_exit 0 "kvctl health" /usr/bin/kvctl --socket-dir "$RUN" health
expect_exit 0 "kvctl put through the worker socket" \
  /usr/bin/kvctl --socket-dir "$RUN" put --str pkg-test --value "from the package"
expect_exit 0 "kvctl get" /usr/bin/kvctl --socket-dir "$RUN" get --str pkg-test
check "the block comes back" sh -c "tr -d '\\0' < '$T/out' | grep -qx 'from the package'"
kill -TERM "$KVD" 2>/dev/null
wait "$KVD"
rc=$?
PIDS=()
check "SIGTERM stops it, exit 0 (got $rc)" test "$rc" -eq 0
check "its G3 file is in /var/lib/kvcached" test -n "$(ls -A /var/lib/kvcached)"

# a program of an engine: pkg-config, then the CMake package
mkdir -p "$T/app"
cat > "$T/app/main.c" <<'EOF'
/* Prints the library's version and the chained key of tokens 1, 2, 3 (no
 * parent, no salt), computed twice: one block by kvc_chain_hash, the same
 * block by kvc_chain_keys. */
#include <kvclient.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const int32_t tokens[3] = {1, 2, 3};
  uint8_t a[KVC_DIGEST_BYTES], b[KVC_DIGEST_BYTES];
  if (kvc_chain_hash(a, NULL, tokens, 3, NULL, 0, NULL, 0) != 0) return 1;
  if (kvc_chain_keys(b, 1, NULL, tokens, 3, 3, NULL, 0, NULL, 0) != 1) return 1;
  if (memcmp(a, b, sizeof a) != 0) return 1;
  printf("%s ", kvc_version());
  for (size_t i = 0; i < sizeof a; i++) printf("%02x", a[i]);
  printf("\n");
  return 0;
}
EOF
# BLAKE2b-256 of "kvcached-chain-v1" || 32 zero bytes || LE32(3) || LE32(1..3)
# (kvclient.h), unkeyed: what the installed library must print.
WANT=$(/usr/bin/python3 -c 'import hashlib, struct
print(hashlib.blake2b(b"kvcached-chain-v1" + bytes(32) + struct.pack("<4I", 3, 1, 2, 3),
                      digest_size=32).hexdigest())' 2>/dev/null)
expect_exit 0 "pkg-config --cflags --libs kvclient" pkg-config --cflags --libs kvclient
check "pkg-config links -lkvclient" grep -qw -- -lkvclient "$T/out"
check "pkg-config --modversion is $VERSION" test "$(pkg-config --modversion kvclient)" = "$VERSION"
# shellcheck disable=SC2046
if cc -o "$T/app/by_pc" "$T/app/main.c" $(pkg-config --cflags --libs kvclient) 2>"$T/cc.err"; then
  ok "a C program builds with pkg-config"
else bad "cc: $(cat "$T/cc.err")"; fi
expect_exit 0 "it runs" "$T/app/by_pc"
check "it prints the version and the key (${WANT:0:16}...)" grep -qx "$VERSION ${WANT:-?}" "$T/out"
ldd "$T/app/by_pc" > "$T/ldd" 2>&1
check "it loads the installed libkvclient.so.0" \
  grep -qE 'libkvclient\.so\.0 => (/usr)?/lib/[^ ]+/libkvclient\.so\.0' "$T/ldd"

cat > "$T/app/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(engine C)
find_package(kvclient 0.1 REQUIRED)
add_executable(by_cmake main.c)
target_link_libraries(by_cmake PRIVATE kvclient::kvclient)
add_executable(by_cmake_static main.c)
target_link_libraries(by_cmake_static PRIVATE kvclient::kvclient_static)
EOF
if cmake -S "$T/app" -B "$T/app/b" >"$T/app.log" 2>&1 \
   && cmake --build "$T/app/b" >>"$T/app.log" 2>&1; then
  ok "a CMake project builds with find_package(kvclient)"
else bad "CMake project: $(tail -20 "$T/app.log")"; fi
check "it found the installed package" \
  grep -qE '^kvclient_DIR:PATH=/usr/lib/[^/]+/cmake/kvclient$' "$T/app/b/CMakeCache.txt"
expect_exit 0 "kvclient::kvclient: it runs" "$T/app/b/by_cmake"
check "and prints the same" grep -qx "$VERSION ${WANT:-?}" "$T/out"
check "it loads the installed shared library" \
  sh -c "ldd '$T/app/b/by_cmake' | grep -qE 'libkvclient.so.0 => (/usr)?/lib/'"
expect_exit 0 "kvclient::kvclient_static: it runs" "$T/app/b/by_cmake_static"
check "and prints the same" grep -qx "$VERSION ${WANT:-?}" "$T/out"
check "it needs no libkvclient.so" sh -c "! ldd '$T/app/b/by_cmake_static' | grep -q libkvclient"
sed -i 's/kvclient 0.1 REQUIRED/kvclient 9.0 REQUIRED/' "$T/app/CMakeLists.txt"
expect_exit 1 "find_package(kvclient 9.0) is refused (another version)" \
  cmake -S "$T/app" -B "$T/app/b9"

# installed again, as an upgrade runs the scripts: the same account
t=$SECONDS
if dpkg -i "${DEB[@]}" >"$T/reinstall.log" 2>&1; then ok "dpkg -i again ($((SECONDS - t)) s)"
else bad "dpkg -i again: $(tail -20 "$T/reinstall.log")"; fi
check "the same user kvcached (uid $uid)" test "$(id -u kvcached 2>/dev/null)" = "$uid"
# what `systemctl enable kvcached` makes, so that the purge has it to remove
WANTS=/etc/systemd/system/multi-user.target.wants
[ -d "$WANTS" ] && ln -sf "$UNIT" "$WANTS/kvcached.service"

# --- purge ----------------------------------------------------------------------------------
t=$SECONDS
if dpkg --purge "${PKGS[@]}" >"$T/purge.log" 2>&1; then
  ok "dpkg --purge of the three ($((SECONDS - t)) s)"
else bad "dpkg --purge: $(tail -20 "$T/purge.log")"; fi
for p in "${PKGS[@]}"; do
  s=$(state "$p")
  check "$p is gone (${s:-unknown to dpkg})" test -z "$s" -o "$s" = not-installed
done
# A directory stays when another package has it or files of others are
# in it (/lib may be a link to /usr/lib); anything else that stays is left.
left=$(cat "$T"/*.installed | sort -u | while read -r f; do
         [ -e "$f" ] || [ -L "$f" ] || continue
         if [ -d "$f" ]; then
           dpkg -S "$f" >/dev/null 2>&1 && continue
           [ -n "$(ls -A "$f")" ] && continue
         fi
         echo "$f"
       done | tr '\n' ' ')
[ -z "$left" ] && ok "no file or directory of the packages is left" || bad "left behind: $left"
for path in /etc/kvcached /var/lib/kvcached /usr/share/doc/kvcached; do
  check "$path is gone" test ! -e "$path"
done
[ -d "$WANTS" ] && check "the unit's enablement link is gone" test ! -L "$WANTS/kvcached.service"
check "user kvcached is gone" sh -c "! getent passwd kvcached >/dev/null"
check "group kvcached is gone" sh -c "! getent group kvcached >/dev/null"

# postinst's other way to the account, where systemd-sysusers is missing:
# adduser (which appends ",,," to the comment field); postrm still knows
# the user for the package's and removes it
mkdir -p "$T/ctl"
dpkg-deb -e "${DEB[kvcached]}" "$T/ctl"
sed 's/command -v systemd-sysusers >\/dev\/null 2>&1/false/' "$T/ctl/postinst" \
  > "$T/ctl/postinst.adduser"
if cmp -s "$T/ctl/postinst" "$T/ctl/postinst.adduser"; then
  bad "postinst has no 'command -v systemd-sysusers' to turn off"
else
  expect_exit 0 "postinst configure, without systemd-sysusers" \
    sh "$T/ctl/postinst.adduser" configure
  check "adduser made user kvcached, with the package's comment first" \
    test "$(getent passwd kvcached | cut -d: -f5 | cut -d, -f1)" = "$GECOS"
  expect_exit 0 "postrm purge" sh "$T/ctl/postrm" purge
  check "it removed user kvcached" sh -c "! getent passwd kvcached >/dev/null"
  check "and group kvcached" sh -c "! getent group kvcached >/dev/null"
fi
echo "# $((SECONDS - start)) s in all"
finish
