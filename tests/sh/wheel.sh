#!/usr/bin/env bash
# wheel.sh - the kvclient wheel (client/python/README.md, "Wheel"): built by
# the project's Python environment's pip without the network
# (scikit-build-core runs this checkout's CMake into a private build
# directory), one file that carries libkvclient.so and the libraries it
# needs beyond the base system, RUNPATH $ORIGIN and nothing of the build
# machine; installed with --no-deps --no-index into a FRESH virtual
# environment, imported from outside the checkout without KVCLIENT_LIB, it
# loads the library from that environment and stores and reads back blocks
# through a real kvcached started here. The checkout is left as it was.
#
# WHEEL_EXTRA_TEST=FILE.py: also runs that pytest file with the fresh
# environment's interpreter (the project environment's packages, vLLM's
# among them, visible after its own through a .pth file), with
# KVCACHED_BIN, KVCACHED_SOCKET (the daemon started here) and
# KVCLIENT_WHEEL_VENV set, and checks that kvclient still came from the
# fresh environment (a conftest that puts client/python first on sys.path
# would import the checkout's copy instead).
source "$(dirname "$0")/lib.bash"
unset KVCLIENT_LIB PYTHONPATH PYTHONHOME

# --- what it needs: the project's Python environment with scikit-build-core:
# $KV_PYTHON3 (ctest sets it: the interpreter tests/CMakeLists.txt found),
# else deploy/install-python.sh's, where deploy/deps-prefix.sh puts it
VPY=${KV_PYTHON3:-$(bash "$SRC/deploy/deps-prefix.sh")/venv/bin/python}
if [ ! -x "$VPY" ]; then
  echo "skipped: no project Python environment ($VPY; deploy/install-python.sh)"; exit 77
fi
if ! "$VPY" -c "import scikit_build_core, pip" 2>/dev/null; then
  echo "skipped: $VPY has no scikit-build-core or pip (deploy/install-python.sh installs them)"; exit 77
fi
if [ ! -x "$BIN/kvcached" ]; then echo "skipped: $BIN/kvcached not built"; exit 77; fi
for tool in readelf ldd; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool not found (binutils, libc-bin)"; exit 77; }
done
echo "# environment: $VPY"
start=$SECONDS
# what a build could leave in the package's folder (setuptools' and
# scikit-build's build/, egg-info, a copy of the library in kvclient/lib)
outputs() { (cd "$SRC/client/python" && ls -d build dist _skbuild ./*.egg-info kvclient/lib 2>/dev/null); }
before=$(outputs)

# --- the wheel ------------------------------------------------------------------------
mkdir -p "$T/dist" "$T/run"
PIP=("$VPY" -m pip --disable-pip-version-check --no-cache-dir --no-input)
if CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "${PIP[@]}" wheel --no-deps \
     --no-build-isolation --no-index -w "$T/dist" --config-settings "build-dir=$T/build" \
     "$SRC/client/python" >"$T/wheel.log" 2>&1; then
  ok "pip wheel builds kvclient ($((SECONDS - start)) s)"
else
  bad "pip wheel: $(tail -30 "$T/wheel.log")"; finish; exit
fi
whls=("$T"/dist/kvclient-*.whl)
check "one wheel, tagged py3-none-linux (ctypes, no extension module)" \
  test "${#whls[@]}" -eq 1 -a -f "${whls[0]}" -a -z "${whls[0]##*-py3-none-linux_*.whl}"
WHL=${whls[0]}
echo "# $(basename "$WHL"): $(stat -c %s "$WHL") bytes"
"$VPY" - "$WHL" >"$T/list" <<'EOF'
import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    print(f"{i.file_size:10d}  {i.filename}")
EOF
sed 's/^/#   /' "$T/list"
check "the wheel carries kvclient/lib/libkvclient.so.0" grep -q ' kvclient/lib/libkvclient\.so\.0$' "$T/list"
check "one copy of the library (no link chain stored as copies)" \
  test "$(grep -c ' kvclient/lib/libkvclient' "$T/list")" -eq 1
check "and the Python package" grep -q ' kvclient/client\.py$' "$T/list"
check "no tests and no bytecode in it" sh -c "! grep -qE '/tests/|__pycache__|\\.pyc\$' '$T/list'"
check "the checkout is left as it was (no build output in client/python)" \
  test "$(outputs)" = "$before"

# --- a fresh environment, the wheel alone installed in it --------------------------------
"$VPY" -m venv --without-pip "$T/venv" 2>"$T/err" && ok "fresh venv" || { bad "venv: $(cat "$T/err")"; finish; exit; }
VENV=$T/venv
"${PIP[@]}" --python "$VENV/bin/python" install --no-deps --no-index -q "$WHL" >"$T/out" 2>&1 \
  && ok "pip install --no-deps --no-index of the wheel" || { bad "install: $(cat "$T/out")"; finish; exit; }
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
LIB=$SITE/kvclient/lib/libkvclient.so.0
check "installed: $LIB" test -f "$LIB"
runpath=$(readelf -d "$LIB" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
check "RUNPATH is \$ORIGIN alone (was: '$runpath'; no path of the build machine)" test "$runpath" = '$ORIGIN'
check "no RPATH" sh -c "! readelf -d '$LIB' | grep -q '(RPATH)'"
echo "# NEEDED: $(readelf -d "$LIB" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
env -i ldd "$LIB" >"$T/ldd" 2>&1
sed 's/^/#   /' "$T/ldd"
check "every library it needs is found without LD_LIBRARY_PATH" sh -c "! grep -q 'not found' '$T/ldd'"
check "none from the checkout or the build directory" \
  sh -c "! grep -qE '$SRC/|$T/build' '$T/ldd'"
bundled=$(cd "$SITE/kvclient/lib" && ls | grep -v '^libkvclient' | tr '\n' ' ')
echo "# bundled beside it: ${bundled:-nothing}"
for b in $bundled; do
  check "$b is resolved to the wheel's copy" grep -q "$b => $SITE/kvclient/lib/$b" "$T/ldd"
done

# --- a real daemon, and the installed package against it, from outside the checkout -------
RUN=$T/sock
SOCK=$RUN/kvcached.sock
"$BIN/kvcached" --socket-dir "$RUN" --g2-capacity 16M --set g2.page_size=4M --set g2.lock=no \
  --set g1.enable=off --g3-path "" 2>"$T/log" &
daemon=$!
PIDS+=("$daemon")
if wait_for "$T/log" "ready:" 10; then ok "kvcached ready"; else bad "kvcached: $(cat "$T/log")"; finish; exit; fi

cat >"$T/check.py" <<'EOF'
import os, sys
venv, src = os.path.realpath(os.environ["VENV"]), os.path.realpath(os.environ["SRC"])
fails = 0
def check(what, cond, detail=""):
    global fails
    print(("ok   - " if cond else "FAIL - ") + what + (f" ({detail})" if detail and not cond else ""))
    fails += not cond
def inside(p, d):
    return os.path.realpath(p).startswith(d + os.sep)

import kvclient
from kvclient import Client, Layout, _lib
print(f"# kvclient {kvclient.__version__} imported from {kvclient.__file__}")
check("kvclient is imported from the fresh venv", inside(kvclient.__file__, venv), kvclient.__file__)
version = kvclient.library_version()
lp = kvclient.library_path()
print(f"# libkvclient {version} loaded from {lp}")
check("libkvclient is loaded from the venv's kvclient/lib", inside(lp, venv)
      and os.path.dirname(lp) == os.path.join(os.path.dirname(kvclient.__file__), "lib"), lp)
mapped = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/" in l and ".so" in l})
for m in mapped:
    if os.path.basename(m).startswith(("libkvclient", "libsodium", "libcudart")):
        print(f"#   mapped: {m}")
check("nothing mapped from the checkout", not any(inside(m, src) for m in mapped),
      [m for m in mapped if inside(m, src)])
check("every function the package declares is in the library",
      all(getattr(_lib.lib(), n, None) is not None for n in _lib._SIGS))

layout = Layout(block_bytes=4096, tokens_per_block=16, layers=2, kv_heads=2, head_dim=64,
                dtype="fp16")
with Client(os.environ["SOCK"], tenant="wheel", layout=layout) as c:
    keys = c.chain_keys(list(range(16 * 3)))
    with c.alloc(keys, parents=[None] + keys[:-1]) as a:
        for i, b in enumerate(a.blocks):
            b.write(bytes([i + 1]) * 4096)
        check("alloc and commit 3 blocks", a.commit() == [0, 0, 0])
    hit, tiers = c.lookup(keys)
    check("lookup finds them in G2", hit == 3, (hit, tiers))
    with c.load(keys) as got:
        check("load reads back what was stored (CRC-verified copies)",
              [bytes(b.read()) for b in got.blocks] == [bytes([i + 1]) * 4096 for i in range(3)])
    block = bytes(range(256)) * 16
    c.put(b"wheel-inline", block)
    check("put and get a block through the inline path", c.get(b"wheel-inline") == block)
sys.exit(1 if fails else 0)
EOF
count() { # count FILE: adds its ok/FAIL lines to the totals
  PASS=$((PASS + $(grep -c '^ok   - ' "$1"))); FAIL=$((FAIL + $(grep -c '^FAIL - ' "$1")))
}
(cd "$T/run" && env VENV="$VENV" SRC="$SRC" SOCK="$SOCK" "$VENV/bin/python" "$T/check.py") >"$T/py.out" 2>&1
rc=$?
cat "$T/py.out"
count "$T/py.out"
[ $rc -eq 0 ] || grep -q '^FAIL' "$T/py.out" || bad "the check script exited $rc"

# --- WHEEL_EXTRA_TEST: a pytest file run by the fresh environment ---------------------
# By default the vLLM test's engines A and B (client/python/tests/test_vllm.py:
# a real vLLM loads the connector from the wheel); WHEEL_EXTRA_TEST=none: none.
extra_args=()
if [ -z "${WHEEL_EXTRA_TEST:-}" ] && "$VPY" -c "import vllm" >/dev/null 2>&1; then
  WHEEL_EXTRA_TEST=$SRC/client/python/tests/test_vllm.py
  extra_args=(-k "engine_a or engine_b")
fi
[ "${WHEEL_EXTRA_TEST:-}" = none ] && WHEEL_EXTRA_TEST=
if [ -n "${WHEEL_EXTRA_TEST:-}" ]; then
  EXTRA=$(realpath "$WHEEL_EXTRA_TEST")
  VSITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir appends, after the fresh venv's own site-packages, and reads
  # that directory's .pth files too.
  echo "import site; site.addsitedir('$VSITE')" >"$SITE/zz_kvcached_deps.pth"
  cat >"$SITE/kvwheel_check.py" <<'EOF'
"""pytest plugin (-p kvwheel_check): where kvclient came from, once the
session has imported it, written to $KVWHEEL_REPORT."""
import os, sys
def pytest_sessionfinish(session, exitstatus):
    m = sys.modules.get("kvclient")
    with open(os.environ["KVWHEEL_REPORT"], "w") as f:
        f.write(f"module {m.__file__ if m else '-'}\n")
        lib = sys.modules.get("kvclient._lib")
        f.write(f"library {(lib.path() if lib else None) or '-'}\n")
        rt = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libcudart.so" in l})
        f.write(f"cudart {' '.join(rt) or '-'}\n")
EOF
  (cd "$T/run" && "$VENV/bin/python" -c "import kvclient, pytest; print(kvclient.__file__)") >"$T/out" 2>&1
  check "with the .pth: pytest is found and kvclient still comes from the fresh venv ($(cat "$T/out"))" \
    grep -q "^$SITE/kvclient/__init__.py$" "$T/out"
  echo "# extra test: $EXTRA"
  (cd "$T/run" && env KVCACHED_BIN="$BIN/kvcached" KVCACHED_SOCKET="$SOCK" KVCLIENT_WHEEL_VENV="$VENV" \
     KVWHEEL_REPORT="$T/report" PYTHONDONTWRITEBYTECODE=1 \
     "$VENV/bin/python" -m pytest -q -p no:cacheprovider -p kvwheel_check "${extra_args[@]}" "$EXTRA") \
     >"$T/extra.out" 2>&1
  rc=$?
  tail -40 "$T/extra.out" | sed 's/^/#   /'
  if [ $rc -eq 0 ]; then ok "extra test passed"
  elif [ $rc -eq 5 ]; then bad "extra test: no tests collected"
  else bad "extra test exited $rc"; fi
  if [ ! -s "$T/report" ]; then bad "the extra test's session did not finish (no report of where kvclient came from)"
  else
    mod=$(sed -n 's/^module //p' "$T/report")
    lib=$(sed -n 's/^library //p' "$T/report")
    if [ "$mod" = - ]; then echo "# the extra test did not import kvclient"
    else check "in the extra test, kvclient came from the fresh venv ($mod)" test "${mod#"$SITE"/}" != "$mod"
    fi
    [ "$lib" = - ] || check "and libkvclient from its kvclient/lib ($lib)" test "$lib" = "$LIB"
    rt=$(sed -n 's/^cudart //p' "$T/report")
    echo "# CUDA runtime in the extra test's process: $rt"
    check "at most one CUDA runtime of a soname in it (the environment's, when it has one)" \
      test "$(echo "$rt" | tr ' ' '\n' | grep -v '^-\?$' | xargs -rn1 basename | sort | uniq -d)" = ""
  fi
fi
kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null

echo "# $((SECONDS - start)) s"
finish
