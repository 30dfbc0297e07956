"""kvclient.Client against a real kvcached: the session, every operation,
zero-copy views, per-block results, errors, the asyncio form, and that the
ctypes declarations agree with client/kvclient.h."""
import asyncio
import ctypes
import errno
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import pytest

import kvclient
from kvclient import G2, TIER_NONE, Client, KvError, Layout, chain_hash, chain_keys
from kvclient import _lib
from kvclient.aio import AsyncClient
from kvclient.errors import CODES

from conftest import REPO, Daemon, http_get

LAYOUT = Layout(block_bytes=4096, tokens_per_block=16, layers=2, kv_heads=2, head_dim=64,
                dtype="fp16")


def connect(daemon, layout=LAYOUT, **kw):
    kw.setdefault("tenant", "t")
    return Client(daemon.socket, layout=layout, **kw)


def store(c, keys, fill=lambda i: bytes([i % 251 + 1])):
    """Stores keys as one chain; block i is filled with fill(i)."""
    with c.alloc(keys, parents=[None] + keys[:-1]) as a:
        for i, b in enumerate(a.blocks):
            assert b.ok, b.error
            b.view[:] = fill(i) * (len(b.view) // len(fill(i)))
        assert a.commit() == [0] * len(keys)


# --- the C ABI as ctypes sees it ------------------------------------------------

STRUCTS = {"kvc_key": _lib.KvcKey, "kvc_layout": _lib.KvcLayout, "kvc_opts": _lib.KvcOpts,
           "kvc_g1": _lib.KvcG1, "kvc_g2": _lib.KvcG2, "kvc_block": _lib.KvcBlock,
           "kvc_completion": _lib.KvcCompletion, "kvc_page_layout": _lib.KvcPageLayout,
           "kvc_copy": _lib.KvcCopy, "kvc_lookup_info": _lib.KvcLookupInfo}


def test_struct_sizes_match_the_header(tmp_path):
    """Compiles client/kvclient.h and compares every structure's size and
    field offsets with the ctypes declarations (a drift corrupts memory)."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "client/kvclient.h"',
             'int main(void) {']
    for cname, py in STRUCTS.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        for f, _ in py._fields_:
            lines.append(f'  printf("{cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    lines += ['  return 0;', '}']
    src = tmp_path / "sizes.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "sizes"
    subprocess.run(["cc", "-I", REPO, str(src), "-o", str(exe)], check=True)
    got = dict(l.split() for l in subprocess.run([str(exe)], capture_output=True, text=True,
                                                   check=True).stdout.splitlines())
    for cname, py in STRUCTS.items():
        assert int(got[cname]) == ctypes.sizeof(py), cname
        for f, _ in py._fields_:
            assert int(got[f"{cname}.{f}"]) == getattr(py, f).offset, f"{cname}.{f}"


def test_block_results_unpack_as_the_structure_lays_them_out():
    b = (_lib.KvcBlock * 2)()
    b[1].status, b[1].tier, b[1].ptr, b[1].length = -10002, 255, 0x1234567890, 4096
    assert struct.calcsize(_lib.BLOCK_FORMAT) == ctypes.sizeof(_lib.KvcBlock)
    assert kvclient.client._blocks(b, 2) == [(0, 0, 0, 0), (-10002, 255, 0x1234567890, 4096)]


def test_error_codes_match_base_errors_h():
    text = open(os.path.join(REPO, "base", "errors.h")).read()
    base = int(re.search(r"#define KV_ERR_BASE (\d+)", text).group(1))
    table = dict((f"KV_E{n}", -(base + int(o))) for n, o in re.findall(r"X\((\w+),\s*(\d+),", text))
    assert table == CODES


def test_every_declared_function_exists():
    L = _lib.lib()
    missing = [n for n in _lib._SIGS if getattr(L, n, None) is None]
    assert not missing, f"{_lib.path()} lacks {missing}"


def test_library_is_found_from_env_and_fails_clearly(tmp_path):
    code = "import kvclient; print(kvclient.library_version(), kvclient.library_path())"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client", "python"))
    _lib.lib()
    libdir = os.path.dirname(_lib.path())
    env["KVCLIENT_LIB"] = libdir
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == kvclient.library_version()
    assert os.path.dirname(r.stdout.split()[1]) == libdir
    env["KVCLIENT_LIB"] = str(tmp_path / "nope.so")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "KVCLIENT_LIB" in r.stderr and "nope.so" in r.stderr


def test_an_installed_library_is_found_on_the_library_path(tmp_path):
    """cmake --install into a prefix; the package, copied away from the
    checkout (no build tree beside it) and without KVCLIENT_LIB, loads the
    installed libkvclient.so.0 from the library path."""
    _lib.lib()
    build = os.path.dirname(os.path.dirname(os.path.realpath(_lib.path())))
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")) or not shutil.which("cmake"):
        pytest.skip(f"{_lib.path()} is not in a CMake build tree with cmake at hand")
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    libdir = next(p for p in prefix.glob("lib*") if (p / "libkvclient.so.0").exists())
    shutil.copytree(os.path.join(REPO, "client", "python", "kvclient"), tmp_path / "pkg" / "kvclient",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("KVCLIENT_LIB", "PYTHONPATH")}
    env.update(PYTHONPATH=str(tmp_path / "pkg"),
               LD_LIBRARY_PATH=f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":"))
    code = ("import kvclient; v = kvclient.library_version(); "
            "print(v, kvclient.library_path(), open('/proc/self/maps').read())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    version, path, maps = r.stdout.split(None, 2)
    assert version == kvclient.library_version() and "build" not in path, path
    assert str(libdir) in maps and os.path.join(build, "lib") not in maps


# --- keys ---------------------------------------------------------------------

def reference_chain_hash(tokens, parent=None, extra=b"", salt=b""):
    """The definition in client/kvclient.h, written again with hashlib."""
    if salt and not 16 <= len(salt) <= 64:
        salt = hashlib.blake2b(salt, digest_size=32).digest()
    h = hashlib.blake2b(digest_size=32, key=salt)
    h.update(b"kvcached-chain-v1")
    h.update(parent if parent else bytes(32))
    h.update(struct.pack("<I", len(tokens)))
    h.update(b"".join(struct.pack("<I", t & 0xFFFFFFFF) for t in tokens))
    h.update(extra)
    return h.digest()


@pytest.mark.parametrize("salt", [b"", b"s", b"0123456789abcdef", b"x" * 64, b"y" * 65])
def test_chain_hash_is_the_documented_blake2b(salt):
    toks = [1, 2, 3, 70000, -1, 0]
    p = reference_chain_hash([9])
    assert chain_hash(toks, salt=salt) == reference_chain_hash(toks, salt=salt)
    assert chain_hash(toks, p, b"lora:7", salt) == reference_chain_hash(toks, p, b"lora:7", salt)
    assert chain_hash([], salt=salt) == reference_chain_hash([], salt=salt)


def test_chain_keys_cover_full_blocks_and_chain():
    toks = list(range(50))
    ks = chain_keys(toks, 16)
    assert len(ks) == 3
    assert ks[0] == chain_hash(toks[:16])
    assert ks[2] == chain_hash(toks[32:48], chain_hash(toks[16:32], ks[0]))
    assert chain_keys(toks, 16, salt=b"a")[0] != ks[0]
    assert chain_keys(toks, 16, salt=b"a")[1] == chain_hash(toks[16:32], chain_hash(toks[:16], salt=b"a"), salt=b"a")
    assert chain_keys(toks, 16, extra=b"img:1")[1] != ks[1]
    changed = toks[:]
    changed[3] = 999  # a change in block 0 changes every later key
    assert all(a != b for a, b in zip(chain_keys(changed, 16), ks))
    with pytest.raises(ValueError):
        chain_hash([1], parent=b"short")


# --- the session ----------------------------------------------------------------

def test_open_without_a_daemon_says_where(tmp_path):
    with pytest.raises(KvError) as e:
        Client(str(tmp_path / "none.sock"), tenant="t", layout=LAYOUT)
    assert e.value.code in (-errno.ENOENT, -errno.ECONNREFUSED)
    assert "none.sock" in str(e.value) and e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)


def test_bad_layouts_are_refused_before_the_wire(daemon):
    for bad in (dict(block_bytes=0), dict(tp_rank=2, tp_size=2), dict(dtype=""),
                dict(dtype="x" * 17)):
        lay = Layout(**{**LAYOUT.__dict__, **bad})
        with pytest.raises(ValueError):
            connect(daemon, lay)


def test_block_larger_than_a_g2_page_is_refused_with_the_reason(daemon):
    with pytest.raises(KvError) as e:
        connect(daemon, Layout(8 << 20, 16, 1, 1, 1, "u8"))
    assert e.value.name == "KV_ETOOBIG"


def test_store_lookup_load_release_round_trip(daemon):
    with connect(daemon) as c:
        assert c.session_id > 0 and c.slot_bytes >= 4096
        keys = c.chain_keys(list(range(16 * 5)))
        assert c.lookup(keys) == (0, [TIER_NONE] * 5)
        store(c, keys)
        assert c.lookup(keys) == (5, [G2] * 5)
        with c.load(keys) as got:
            assert got.usable == 5 and got.prefix == 5
            for i, b in enumerate(got.blocks):
                assert b.ok and b.tier == G2 and b.length == 4096
                assert bytes(b.view[:3]) == bytes([i + 1]) * 3
        assert got.released


def test_lookups_are_answered_from_the_presence_table(daemon):
    """Client.lookup answers from the namespace's presence table (protocol
    1.5) with the daemon's meaning; lookup="daemon" asks the daemon."""
    with connect(daemon) as c, connect(daemon, lookup="daemon") as d:
        st = c.lookup_stats()
        assert st["mapped"] and st["mode"] == "auto" and st["bytes"] > 0, st
        assert d.lookup_stats()["mode"] == "daemon" and not d.lookup_stats()["mapped"]
        keys = c.chain_keys(list(range(16 * 6)))
        store(c, keys[:4])
        for sub in (keys, keys[:4], keys[2:], keys[5:], keys[:1]):
            assert c.lookup(sub) == d.lookup(sub)
        assert c.lookup(keys) == (4, [G2] * 4 + [TIER_NONE] * 2)
        st = c.lookup_stats()
        assert st["local"] == 6 and st["daemon"] == 0, st
        assert d.lookup_stats()["daemon"] == 5 and d.lookup_stats()["local"] == 0
        c.delete(keys[1:2])
        assert c.lookup(keys)[0] == 1, "a delete is seen at once"
    with pytest.raises(ValueError):
        connect(daemon, lookup="sometimes")


def test_views_are_zero_copy_over_the_shared_mapping(daemon):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(32)))
        store(c, keys)
        with c.load(keys) as got:
            b = got.blocks[1]
            arr = b.numpy(np.float16)
            assert arr.__array_interface__["data"][0] == b.ptr and arr.size == 2048
            t = b.torch(torch.float16)
            assert t.data_ptr() == b.ptr and t.numel() == 2048
            mv = b.view
            assert mv.readonly
            assert bytes(mv[:2]) == b"\x02\x02"
        # a new allocation's writable view, written through torch, is what
        # the next load reads (no copy anywhere in between)
        k2 = c.chain_keys(list(range(100, 116)))
        with c.alloc(k2) as a:
            t = a.blocks[0].torch(torch.int16)
            t[:] = torch.arange(2048, dtype=torch.int16)
            a.commit()
        with c.load(k2) as got:
            assert torch.equal(got.blocks[0].torch(torch.int16), torch.arange(2048, dtype=torch.int16))


def test_failed_blocks_stay_per_block(daemon):
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(48)))
        store(c, keys[:2])
        missing = b"\x07" * 32
        with c.load([keys[0], missing, keys[1]]) as got:
            assert [b.ok for b in got.blocks] == [True, False, True]
            assert got.prefix == 1 and got.usable == 2
            bad = got.blocks[1]
            assert bad.status == CODES["KV_ENOTFOUND"] and bad.error.name == "KV_ENOTFOUND"
            assert "not found" in str(bad.error)
            with pytest.raises(KvError):
                bad.view
        with pytest.raises(KvError) as e:  # views die with the pins
            got.blocks[0].view
        assert e.value.errno == errno.EBADF


def test_allocation_is_invisible_until_commit_and_aborted_on_error(daemon):
    with connect(daemon) as c, connect(daemon) as other:
        keys = c.chain_keys(list(range(32)))
        with pytest.raises(RuntimeError):
            with c.alloc(keys) as a:
                a.blocks[0].view[:] = b"\x01" * 4096
                assert other.lookup(keys)[0] == 0  # not visible while written
                raise RuntimeError("engine failed mid-write")
        assert other.lookup(keys)[0] == 0
        store(c, keys)
        with c.alloc(keys) as a:  # the same keys again: they exist
            assert [b.status for b in a.blocks] == [CODES["KV_EEXISTS"]] * 2
            assert a.usable == 0
        # a partial commit: block 1 is aborted, block 0 becomes visible
        k2 = c.chain_keys(list(range(500, 532)))
        with c.alloc(k2) as a:
            a.commit([0])
        assert other.lookup(k2) == (1, [G2, TIER_NONE])
        with pytest.raises(KvError):
            a.commit()


def test_namespaces_isolate_tenants_salts_and_layouts(tmp_root):
    daemon = Daemon(tmp_root, tenants=("t", "u")).start()
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(32)))
        store(c, keys)
        with connect(daemon, tenant="u") as u:
            assert u.lookup(keys)[0] == 0
        with connect(daemon, salt=b"other") as s:
            assert s.lookup(keys)[0] == 0
            assert s.chain_keys(list(range(32))) != keys  # salted keys differ too
            assert s.chain_hash(list(range(16))) == chain_hash(list(range(16)), salt=b"other")
        with connect(daemon, Layout(4096, 16, 2, 2, 64, "bf16")) as d:
            assert d.lookup(keys)[0] == 0
        with connect(daemon) as same:
            assert same.lookup(keys)[0] == 2
    daemon.stop()


def test_delete_priority_prefetch_status_put_get(daemon):
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(64)))
        store(c, keys)
        assert c.set_priority(keys[:2], 200) == [0, 0]
        assert c.set_priority([b"\x09" * 32], 1) == [CODES["KV_ENOTFOUND"]]
        assert c.prefetch(keys) >= 0
        st = c.status()
        assert st["g2"]["blocks"] == 4 and st["sessions"] >= 1
        assert c.delete(keys[3:]) == 1
        assert c.lookup(keys)[0] == 3
        k = b"inline-key"
        c.put(k, b"\xab" * 4096)
        assert c.get(k) == b"\xab" * 4096
        with pytest.raises(KvError) as e:
            c.get(b"absent-key")
        assert e.value.name == "KV_ENOTFOUND"
        assert c.delete() == 4  # the whole namespace
        assert c.lookup(keys)[0] == 0


def test_session_ids_and_stop_codes_match_libkvclient():
    # FNV-1a 64's published values, and the C library's function on the same names
    assert kvclient.session_id(b"a") == 0xaf63dc4c8601ec8c
    assert kvclient.session_id("foobar") == 0x85944171f73967e8
    assert kvclient.session_id(7) == 7
    L = _lib.lib()
    for name in [b"", b"chat-1", "sesión".encode(), bytes(range(256))]:
        assert kvclient.session_id(name) == L.kvc_hint_session_id(name, len(name))
    with pytest.raises(ValueError):
        kvclient.session_id(0)
    for name, code in [("end_turn", 1), ("stop", 1), ("tool_calls", 2), ("length", 3),
                       ("refusal", 6), ("", 0), (None, 0), (5, 5)]:
        assert kvclient.stop_code(name) == code
    with pytest.raises(ValueError):
        kvclient.stop_code(7)


def test_hints_reach_committed_blocks_and_are_counted(daemon):
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(64)))
        store(c, keys[:3])
        nf = CODES["KV_ENOTFOUND"]
        assert c.hint_session("conv-1", keys, retain_s=300) == [0, 0, 0, nf]
        assert c.hint_finished("conv-1", "tool_use") == []
        assert c.hint_finished("conv-1", "end_turn", keys[3:]) == [nf]
        c.hint_end("conv-1")
        with pytest.raises(KvError):
            c.hint_session("conv-1", [])  # SESSION names blocks
        assert c.lookup(keys)[0] == 3  # advice only: nothing moved
    code, text = http_get(daemon.stats, "/metrics")
    assert code == 200
    assert 'kvcached_hints_total{kind="session"} 1' in text
    assert 'kvcached_hints_total{kind="finished"} 2' in text
    assert 'kvcached_hint_finished_total{stop="tool_use"} 1' in text


def test_batch_limits_and_bad_keys(daemon):
    with connect(daemon) as c:
        with pytest.raises(KvError) as e:
            c.lookup([b"k" * 32] * 4097)
        assert e.value.errno == errno.E2BIG
        with pytest.raises(ValueError):
            c.lookup([b"a" * 32, b"b" * 31])
        with pytest.raises(ValueError):
            c.lookup([b""])
        with pytest.raises(ValueError):
            c.alloc([b"a" * 32], parents=[b"short"])
        assert c.lookup([]) == (0, [])


def test_a_closed_client_and_its_views_refuse(daemon):
    c = connect(daemon)
    keys = c.chain_keys(list(range(16)))
    store(c, keys)
    got = c.load(keys)
    c.close()
    with pytest.raises(KvError) as e:
        c.lookup(keys)
    assert e.value.errno == errno.EBADF
    got.release()  # after close: nothing to do, no crash
    c.close()  # twice is fine


def test_close_drops_pins_at_once(daemon):
    """A worker's pins belong to its connection: gone when it closes."""
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(32)))
        store(c, keys)
        other = connect(daemon)
        other.load(keys)  # pinned, never released
        assert c.delete(keys) == 0  # pinned blocks are skipped
        other.close()
        # the daemon sees the hang-up on its loop, not in this socket's order
        deadline = time.monotonic() + 5
        n = 0
        while n < 2 and time.monotonic() < deadline:
            n += c.delete(keys)
            time.sleep(0.005)
        assert n == 2


def test_g1_info_says_why_there_is_none(daemon):
    with connect(daemon) as c:
        g = c.g1
        assert not g.available and "g1.enable = off" in g.reason
    with connect(daemon, g1=False) as c:
        assert "not asked for" in c.g1.reason


def test_register_cuda_without_a_device_is_a_clear_error(daemon, monkeypatch):
    monkeypatch.delenv("KV_DEV_BACKEND", raising=False)
    with connect(daemon) as c:
        with pytest.raises(KvError) as e:
            c.register_cuda()
        assert e.value.errno == errno.ENODEV and str(e.value).strip()
        assert c.g2.registered == 0 and c.g2.reason
        store(c, c.chain_keys(list(range(16))))  # the session is unaffected


def test_register_cuda_with_the_simulated_device(daemon, monkeypatch):
    monkeypatch.setenv("KV_DEV_BACKEND", "sim")
    with connect(daemon) as c:
        c.register_cuda()
        c.register_cuda()  # idempotent
        g = c.g2
        assert g.registered == kvclient.G1_SIM and g.bytes > 0 and g.base


# --- verification: the writer checksums, the reader verifies ----------------------

def crc32c(data: bytes) -> int:
    return int(_lib.lib().kvc_crc32c(0, data, len(data)))


def scribble(daemon, key, at=100):
    """What a worker of the tenant can do: write into a committed block
    through its own G2 mapping (a loaded block's view is read-only in this
    package; the mapping is not)."""
    with connect(daemon) as w, w.load([key]) as got:
        b = got.blocks[0]
        assert b.ok
        old = ctypes.string_at(b.ptr + at, 1)
        ctypes.memmove(b.ptr + at, bytes([old[0] ^ 0xff]), 1)


def test_loaded_blocks_carry_their_committed_crc_and_read_verifies(daemon):
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(48)))
        store(c, keys)  # written in place through the views: commit checksums the slots
        with c.load(keys) as got:
            for i, b in enumerate(got.blocks):
                assert b.crc == crc32c(bytes([i + 1]) * 4096)
                data = b.read()
                assert isinstance(data, bytearray) and data == bytes([i + 1]) * 4096
                buf = bytearray(5000)
                mv = b.read(buf)
                assert len(mv) == 4096 and bytes(mv) == bytes(data)
                b.verify()
            with pytest.raises(ValueError):
                got.blocks[0].read(bytearray(100))


def test_a_scribbled_block_is_never_read_and_is_reported(daemon):
    """Issue 16 item 2: a worker wrote into a committed block and the next
    reader got those bytes. Now read() raises KV_ECORRUPT, the daemon
    confirms and drops the block, and a re-store reads back."""
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(48)))
        store(c, keys)
        scribble(daemon, keys[1])
        with c.load(keys) as got:
            assert got.usable == 3  # LOAD does not read the bytes: the reader does
            assert bytes(got.blocks[0].read()) == b"\x01" * 4096
            with pytest.raises(KvError) as e:
                got.blocks[1].read()
            assert e.value.name == "KV_ECORRUPT"
            assert not got.blocks[1].ok and got.prefix == 1
            with pytest.raises(KvError):
                got.blocks[1].view  # no view of bytes that failed
        assert daemon.metric("kvcached_pinned_blocks") == 0  # the report took its pin
        assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1
        assert daemon.metric("kvcached_corrupt_dropped_total") == 1
        assert daemon.metric('kvcached_misses_total{reason="corrupt"}') == 1
        assert c.lookup(keys)[1][1] == TIER_NONE
        with c.alloc([keys[1]], parents=[keys[0]]) as a:
            a.blocks[0].write(b"\x02" * 4096)
            assert a.commit() == [0]
        with c.load(keys[1:2]) as got:
            assert got.blocks[0].read() == b"\x02" * 4096


def test_verify_checks_a_view_in_place(daemon):
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(32)))
        store(c, keys)
        scribble(daemon, keys[0], at=4095)
        with c.load(keys) as got:
            got.blocks[1].verify()
            assert bytes(got.blocks[1].view[:1]) == b"\x02"
            with pytest.raises(KvError) as e:
                got.blocks[0].verify()
            assert e.value.name == "KV_ECORRUPT" and not got.blocks[0].ok
        assert daemon.metric('kvcached_corrupt_reported_total{verdict="confirmed"}') == 1


def test_commit_sends_the_crc_of_what_the_slot_holds(daemon):
    """write() copies and checksums in one pass; a block also written in
    place afterwards is checksummed again at commit, so readers accept what
    was committed, however it was written."""
    with connect(daemon) as c:
        keys = c.chain_keys(list(range(48)))
        with c.alloc(keys) as a:
            assert a.blocks[0].write(b"\x0a" * 4096) == crc32c(b"\x0a" * 4096)
            a.blocks[1].write(memoryview(bytearray(b"\x0b" * 4096)))
            a.blocks[1].view[0] = 0x0c  # changed in place after write()
            a.blocks[2].view[:] = b"\x0d" * 4096
            with pytest.raises(ValueError):
                a.blocks[2].write(b"short")
            assert a.commit() == [0, 0, 0]
        with c.load(keys) as got:
            assert got.blocks[0].read() == b"\x0a" * 4096
            assert got.blocks[1].read() == b"\x0c" + b"\x0b" * 4095
            assert got.blocks[2].read() == b"\x0d" * 4096
        # a wrong CRC only makes readers refuse the block
        k = c.chain_keys(list(range(100, 116)))
        a = c.alloc(k)
        a.blocks[0].write(b"\x0e" * 4096)
        assert c.commit(k, [crc32c(b"\x0e" * 4096) ^ 1]) == [0]
        a.done = True  # committed by hand, above
        with c.load(k) as got:
            with pytest.raises(KvError):
                got.blocks[0].read()


# --- asyncio --------------------------------------------------------------------

def test_asyncio_many_requests_in_flight(daemon):
    async def main():
        with connect(daemon) as c:
            ac = AsyncClient(c)
            chains = [c.chain_keys(list(range(j * 1000, j * 1000 + 32))) for j in range(8)]
            allocs = await asyncio.gather(*(ac.alloc(k, parents=[None, k[0]]) for k in chains))
            for j, a in enumerate(allocs):
                for b in a.blocks:
                    b.view[:] = bytes([j + 1]) * 4096
            assert await asyncio.gather(*(ac.commit(a) for a in allocs)) == [[0, 0]] * 8
            looks = await asyncio.gather(*(ac.lookup(k) for k in chains))
            assert looks == [(2, [G2, G2])] * 8
            loads = await asyncio.gather(*(ac.load(k) for k in chains))
            for j, got in enumerate(loads):
                assert bytes(got.blocks[1].view[:1]) == bytes([j + 1])
                assert got.blocks[1].read() == bytes([j + 1]) * 4096  # committed with its CRC
            # a blocking call in between reads replies meant for futures
            fut = asyncio.ensure_future(ac.lookup(chains[0]))
            await asyncio.sleep(0)
            assert c.lookup(chains[1])[0] == 2
            assert (await asyncio.wait_for(fut, 5)) == (2, [G2, G2])
            assert await asyncio.gather(*(ac.release(g) for g in loads)) == [[0, 0]] * 8
            assert await ac.release(loads[0]) == []  # once
            with pytest.raises(ValueError):  # parents are checked as the blocking call checks them
                await ac.alloc(chains[0][:1], parents=[b"short"])
            with pytest.raises(KvError):
                await ac.commit(allocs[0])  # committed already
            ac.close()
    asyncio.run(main())


def test_asyncio_hints(daemon):
    async def main(c):
        ac = AsyncClient(c)
        keys = c.chain_keys(list(range(32)))
        store(c, keys)
        nf = CODES["KV_ENOTFOUND"]
        got = await asyncio.gather(ac.hint("session", "s1", keys + [b"\x07" * 32]),
                                   ac.hint("finished", "s1", stop="length"),
                                   ac.hint("end", "s1"))
        assert got == [[0, 0, nf], [], []]
        with pytest.raises(ValueError):
            await ac.hint("bogus", "s1")
        ac.close()
    with connect(daemon) as c:
        asyncio.run(main(c))
    assert daemon.metric('kvcached_hint_finished_total{stop="max_tokens"}') == 1
    assert daemon.metric('kvcached_hints_total{kind="end"}') == 1


def test_asyncio_fails_pending_requests_when_the_daemon_dies(daemon):
    async def main():
        with connect(daemon) as c:
            ac = AsyncClient(c)
            keys = c.chain_keys(list(range(16)))
            assert (await ac.lookup(keys))[0] == 0
            daemon.stop(9)
            with pytest.raises(KvError):
                await asyncio.wait_for(ac.lookup(keys), 5)
    asyncio.run(main())
