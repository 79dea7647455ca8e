"""The disk cache as a trust boundary (docs/cache.md): what is read from it becomes code that runs.

1. The root and kind folders: created 0700 whatever the umask; refused (one warning naming the folder and the
   reason, a private temporary folder in their place) when another user's, writable by group or others, or a
   symbolic link; nothing is then read from or written into them.
2. Files: opened without following links, owned by this user and not writable by others, else rebuilt.
3. Records: every field of a kernel record and of a tuning entry is checked before use; the host runner refuses
   a kernel name that is not a C identifier before it builds anything from it.
4. Faults: a cache that cannot take a write (a full disk) leaves the host runner running, with one warning.

Each refusal comes with its control: the same planted entry in a private folder is read (so the test fails if
the check it exercises is removed).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autocuda.codegen.ckernel import CParam
from autocuda.runtime import tuning
from autocuda.runtime.records import KernelRecord, RecordError, kernel_record
from autocuda.toolchain import store
from autocuda.toolchain.host import cache as host_cache
from autocuda.toolchain.host import cxx as toolchain
from autocuda.toolchain.host import runner as host_runner
from autocuda.tools.cli import main

OTHER_UID = 4242  # a user that is not this one
IS_ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not IS_ROOT, reason="giving a folder to another user (chown) needs root")


HOST_MISSING = toolchain.missing()
needs_host = pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root not created yet, seen as by a fresh process (no folder checked, no fallback made); this user's
    fallback cache is `fallback` beside it."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "fallback_root", lambda: tmp_path / "fallback")
    monkeypatch.setattr(store, "_exposed_warned", set())
    monkeypatch.setattr(host_cache, "_scratch", {})
    _fresh_process(monkeypatch)
    return tmp_path / "cache"


def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process checked: the next use checks every folder again, as a new process would."""
    monkeypatch.setattr(store, "_accepted", {})
    monkeypatch.setattr(store, "_fallbacks", {})


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _listing(folder: Path) -> list[tuple[str, int, bytes]]:
    """Every path under `folder` with its mode and (for files) bytes: proves nothing was written there."""
    found = []
    for path in sorted(folder.rglob("*")):
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        found.append((str(path.relative_to(folder)), os.lstat(path).st_mode, data))
    return found


def _cache_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, store.CacheWarning)]


# -- a kernel record without sympy: what an attacker plants and what a rebuild makes ---------------------------------
PARAMS = (CParam("x", "float", True, True), CParam("y", "float", True, False), CParam("n", "unsigned int", False, True))
ATTACK = "/* the attacker's code */"


def _record(name: str, source: str) -> KernelRecord:
    return KernelRecord(name, source, PARAMS, 1, 256)


def _builder(calls: list) -> Callable[[], KernelRecord]:
    def build() -> KernelRecord:
        calls.append(1)
        return _record("built_kernel", "/* generated */")
    return build


def _plant(folder: Path, text: str, data: bytes) -> Path:
    """A record entry with a matching ("forged") checksum, written straight into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / store.key(text)
    entry.write_bytes(data)
    entry.with_name(entry.name + ".sha256").write_text(hashlib.sha256(data).hexdigest())
    return entry


def _planted_record() -> bytes:
    return _record("planted_kernel", ATTACK).to_json()


# =====================================================================================================================
# 1. The root and the kind folders
# =====================================================================================================================
def test_root_kind_folders_and_entries_are_private_whatever_the_umask(tmp_path, cache_root, monkeypatch):
    deep = tmp_path / "new" / "parents" / "cache"  # folders on the way that do not exist yet
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(deep))
    previous = os.umask(0)
    try:
        store.save("kernels", "entry", b"data")
        library, _ = host_cache.load_or_build("k" * 64, lambda path: path.write_bytes(b"\x7fELF"))
    finally:
        os.umask(previous)
    assert [_mode(p) for p in (tmp_path / "new", tmp_path / "new" / "parents", deep)] == [0o700] * 3
    assert _mode(deep / "kernels") == _mode(deep / "host") == 0o700
    for path in (deep / "kernels" / "entry", deep / "kernels" / "entry.sha256", library,
                 library.with_name(library.name + ".sha256")):
        assert _mode(path) == 0o600, f"{path} has mode {_mode(path):o}"
    assert library.parent == deep / "host" and store.read("kernels", "entry") == b"data"


def _shared(root: Path) -> str:
    root.chmod(0o777)
    return "writable by group or others (mode 777)"


def _group_writable(root: Path) -> str:
    root.chmod(0o770)
    return "writable by group or others (mode 770)"


def _foreign(root: Path) -> str:
    os.chown(root, OTHER_UID, OTHER_UID)
    return f"owned by uid {OTHER_UID}, not by this user"


# How a root becomes unsafe -> what the warning must say.
UNSAFE_ROOTS = {
    "world-writable": _shared,
    "group-writable": _group_writable,
    "another user's": pytest.param(_foreign, marks=as_root),
}


@pytest.mark.parametrize("make_unsafe", list(UNSAFE_ROOTS.values()), ids=list(UNSAFE_ROOTS))
def test_an_unsafe_root_is_refused_and_nothing_is_read_from_or_written_into_it(make_unsafe, cache_root, monkeypatch):
    entry = _plant(cache_root / "kernels", "probe", _planted_record())
    calls: list = []
    # Control: in a private root the planted record (a matching checksum is all it needs) is what runs.
    assert kernel_record("probe", _builder(calls)).full_codes == ATTACK and not calls
    reason = make_unsafe(cache_root)
    _fresh_process(monkeypatch)
    before = _listing(cache_root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = kernel_record("probe", _builder(calls))
        record_again = kernel_record("probe", _builder(calls))  # from the fallback, silently
    assert record.full_codes == record_again.full_codes == "/* generated */" and len(calls) == 1
    (message,) = _cache_warnings(caught)
    assert str(cache_root) in message and reason in message, message
    assert _listing(cache_root) == before, "something was written into the refused root"
    fallback = store.root()
    assert fallback != cache_root and _mode(fallback) == 0o700 and not fallback.is_relative_to(cache_root)
    assert store.verified(store.folder("kernels") / entry.name)


def test_a_root_reached_through_a_link_is_its_target_and_checked_there(tmp_path, cache_root, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "link"))
    assert store.root() == target
    target.chmod(0o777)
    _fresh_process(monkeypatch)
    with pytest.warns(store.CacheWarning, match="writable by group or others"):
        assert store.root() != target


def _kind_link(kind: Path, outside: Path) -> str:
    kind.symlink_to(outside, target_is_directory=True)
    return "is a symbolic link"


def _kind_shared(kind: Path, outside: Path) -> str:
    kind.mkdir()
    kind.chmod(0o777)
    return "writable by group or others (mode 777)"


def _kind_foreign(kind: Path, outside: Path) -> str:
    kind.mkdir()
    os.chown(kind, OTHER_UID, OTHER_UID)
    return f"owned by uid {OTHER_UID}"


UNSAFE_KINDS = {
    "a symbolic link": _kind_link,
    "world-writable": _kind_shared,
    "another user's": pytest.param(_kind_foreign, marks=as_root),
}


@pytest.mark.parametrize("make_unsafe", list(UNSAFE_KINDS.values()), ids=list(UNSAFE_KINDS))
def test_an_unsafe_kind_folder_is_refused_and_cleared_without_following_it(make_unsafe, tmp_path, cache_root,
                                                                         monkeypatch, capsys):
    outside = tmp_path / "outside"
    _plant(outside, "probe", _planted_record())
    store.folder("specs")  # the root exists and is private
    reason = make_unsafe(cache_root / "kernels", outside)
    if (cache_root / "kernels").is_dir() and not (cache_root / "kernels").is_symlink():
        _plant(cache_root / "kernels", "probe", _planted_record())
    kept = _listing(outside)
    calls: list = []
    with pytest.warns(store.CacheWarning, match=re.escape(reason)) as caught:
        assert kernel_record("probe", _builder(calls)).full_codes == "/* generated */" and calls == [1]
    assert str(cache_root / "kernels") in str(caught[0].message)
    assert store.folder("kernels") != cache_root / "kernels"
    assert main(["cache", "--clear"]) == 0  # removes the folder (a link itself, never what it points to)
    assert "removed" in capsys.readouterr().out
    assert not os.path.lexists(cache_root / "kernels") and _listing(outside) == kept


def test_clear_unlinks_a_link_in_a_kind_folder_place_and_keeps_what_it_points_to(tmp_path, cache_root):
    outside = tmp_path / "outside"
    _plant(outside, "probe", _planted_record())
    store.save("binaries", "b", b"image")
    (cache_root / "kernels").symlink_to(outside)
    assert dict((kind, n) for kind, n, _ in store.usage()) == {"binaries": 1, "kernels": 0}
    assert store.clear() == 1
    assert store.usage() == [] and len(list(outside.iterdir())) == 2


def _lstat(mode: int, uid: int | None = None) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, os.geteuid() if uid is None else uid, 0, 0, 0, 0, 0))


# A folder's lstat -> why it is refused (None: accepted). Runs for any user: no chown needed.
FOLDER_CASES = {
    "private": (_lstat(stat.S_IFDIR | 0o700), None),
    "readable by others": (_lstat(stat.S_IFDIR | 0o755), None),
    "group-writable": (_lstat(stat.S_IFDIR | 0o775), "writable by group or others (mode 775)"),
    "other-writable": (_lstat(stat.S_IFDIR | 0o703), "writable by group or others (mode 703)"),
    "sticky but shared": (_lstat(stat.S_IFDIR | 0o1777), "writable by group or others (mode 1777)"),
    "another user's": (_lstat(stat.S_IFDIR | 0o700, OTHER_UID), f"owned by uid {OTHER_UID}"),
    "a symbolic link": (_lstat(stat.S_IFLNK | 0o777), "is a symbolic link"),
    "a file": (_lstat(stat.S_IFREG | 0o600), "is not a directory"),
}


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_folder_rules(case):
    st, reason = FOLDER_CASES[case]
    found = store.folder_problem(st)
    assert (found is None) if reason is None else (found is not None and reason in found), found


# =====================================================================================================================
# 2. Files
# =====================================================================================================================
def _entry_link(entry: Path, outside: Path) -> None:
    entry.unlink()
    entry.symlink_to(outside)


# How a planted entry in a private kind folder is made untrustworthy, beyond its checksum (which matches).
UNSAFE_ENTRIES = {
    "a symbolic link to a file elsewhere": _entry_link,
    "writable by others": lambda entry, outside: entry.chmod(0o666),
    "another user's": pytest.param(lambda entry, outside: os.chown(entry, OTHER_UID, OTHER_UID), marks=as_root),
}


@pytest.mark.parametrize("make_unsafe", list(UNSAFE_ENTRIES.values()), ids=list(UNSAFE_ENTRIES))
def test_an_entry_that_fails_the_file_checks_is_rebuilt(make_unsafe, tmp_path, cache_root):
    outside = tmp_path / "outside.json"
    outside.write_bytes(_planted_record())
    entry = _plant(store.folder("kernels"), "probe", _planted_record())
    entry.chmod(0o600)
    calls: list = []
    assert kernel_record("probe", _builder(calls)).full_codes == ATTACK and not calls  # control: it is read
    make_unsafe(entry, outside)
    assert store.read("kernels", entry.name) is None
    assert kernel_record("probe", _builder(calls)).full_codes == "/* generated */" and calls == [1]
    assert not entry.is_symlink() and _mode(entry) == 0o600 and os.lstat(entry).st_uid == os.geteuid()
    assert outside.read_bytes() == _planted_record(), "the rebuild wrote through a link"


def test_a_replaced_host_library_that_fails_the_file_checks_is_rebuilt(cache_root):
    calls: list = []

    def build(path: Path) -> None:
        calls.append(path)
        path.write_bytes(b"\x7fELF the user's library")

    library, cached = host_cache.load_or_build("h" * 64, build)
    assert not cached and host_cache.load_or_build("h" * 64, build) == (library, True)
    planted = b"\x7fELF another user's library"
    library.write_bytes(planted)
    library.with_name(library.name + ".sha256").write_text(hashlib.sha256(planted).hexdigest())
    library.chmod(0o666)
    assert host_cache.load_or_build("h" * 64, build) == (library, False) and len(calls) == 2
    assert library.read_bytes() == b"\x7fELF the user's library" and _mode(library) == 0o600


def test_entry_names_are_plain_file_names(cache_root):
    for name in ("../x", "a/b", ".hidden", "x.sha256", "", "x" * 129):
        with pytest.raises(ValueError, match="cache entry name"):
            store.read("kernels", name)
    with pytest.raises(ValueError, match="unknown cache kind"):
        store.folder("../kernels")


# =====================================================================================================================
# 3. Records: every field checked before use
# =====================================================================================================================
def _valid_fields() -> dict:
    return json.loads(_record("planted_kernel", "/* a planted but well-formed record */").to_json())


def _with(**changes) -> bytes:
    return json.dumps(_valid_fields() | changes).encode()


# A stored record -> the field its check must name.
BAD_RECORDS: dict[str, tuple[bytes, str]] = {
    "name escaping a folder": (_with(name="../../../x"), "name"),
    "name closing a C string": (_with(name='k"); system("x'), "name"),
    "name not a string": (_with(name=7), "name"),
    "name too long": (_with(name="k" * 256), "name"),
    "source not a string": (_with(source=["int x;"]), "source"),
    "source empty": (_with(source=""), "source"),
    "source too large": (_with(source="x" * ((1 << 22) + 1)), "source"),
    "param name not an identifier": (_with(params=[["x; evil", "float", True, True]]), "params[0] name"),
    "param C type the builder refuses": (_with(params=[["x", "float; evil()", True, True]]), "params[0]"),
    "param C type spelling a pointer": (_with(params=[["x", "float *", False, True]]), "params[0]"),
    "param pointer flag not a bool": (_with(params=[["x", "float", 1, True]]), "params[0]"),
    "param with a fifth field": (_with(params=[["x", "float", True, True, 0]]), "params[0]"),
    "params repeated": (_with(params=[["x", "float", True, True], ["x", "float", True, False]]), "params"),
    "lanes 0": (_with(lanes=0), "lanes"),
    "lanes a bool": (_with(lanes=True), "lanes"),
    "lanes huge": (_with(lanes=10**9), "lanes"),
    "lanes a float": (_with(lanes=2.0), "lanes"),
    "block 0": (_with(block=0), "block"),
    "block past the GPU's limit": (_with(block=2048), "block"),
    "checkpoint_steps negative": (_with(checkpoint_steps=-1), "checkpoint_steps"),
    "a field missing": (json.dumps({k: v for k, v in _valid_fields().items() if k != "block"}).encode(), "fields"),
    "a field extra": (_with(extra=1), "fields"),
    "not an object": (b"[1, 2]", "fields"),
    "not JSON": (b"\xff\xfe not json", "JSON"),
    "nested past the parser": (b"[" * 100_000 + b"]" * 100_000, "JSON"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_record_with_a_bad_field_is_rebuilt_never_used(case, cache_root):
    data, field = BAD_RECORDS[case]
    with pytest.raises(RecordError, match=field.replace("[", r"\[")):
        KernelRecord.from_json(data)
    _plant(store.folder("kernels"), "probe", data)
    calls: list = []
    record = kernel_record("probe", _builder(calls))
    assert record.full_codes == "/* generated */" and record.kernel_name == "built_kernel" and calls == [1]


def test_a_well_formed_record_is_read_with_every_field(cache_root):
    """The control of the table above: its base record passes every check."""
    data = json.dumps(_valid_fields() | {"lanes": 8, "block": 1024, "checkpoint_steps": 32}).encode()
    record = KernelRecord.from_json(data)
    assert (record.kernel_name, record.lanes, record.block, record.checkpoint_steps) == ("planted_kernel", 8, 1024, 32)
    assert tuple(record.cparams.values()) == PARAMS
    _plant(store.folder("kernels"), "probe", data)
    calls: list = []
    assert kernel_record("probe", _builder(calls)).kernel_name == "planted_kernel" and not calls


LAYOUTS = [{"lanes": 1, "vector": False, "unroll": 8}, {"lanes": 2, "vector": True, "unroll": 8}]
# A stored tuning entry -> the layout used (None: timed again).
TUNING_ENTRIES: dict[str, tuple[bytes | None, int | None]] = {
    "a candidate": (json.dumps(LAYOUTS[1]).encode(), 1),
    "missing": (None, None),
    "not a candidate": (json.dumps({"lanes": 0, "vector": False, "unroll": 8}).encode(), None),
    "a candidate with an extra key": (json.dumps(LAYOUTS[1] | {"block": 0}).encode(), None),
    "a list": (json.dumps([LAYOUTS[1]]).encode(), None),
    "not JSON": (b"\x00\x01", None),
    "nested past the parser": (b"[" * 1500 + b"]" * 1500, None),
    "a candidate padded past the size bound": (json.dumps(LAYOUTS[1]).encode() + b" " * tuning.MAX_ENTRY_BYTES, None),
}


@pytest.mark.parametrize("case", list(TUNING_ENTRIES))
def test_a_tuning_entry_is_used_only_as_one_of_the_candidates(case, cache_root):
    data, index = TUNING_ENTRIES[case]
    if data is not None:
        store.save("tuning", "entry", data)
    found = tuning.stored_layout(store.read("tuning", "entry"), LAYOUTS)
    assert found is (None if index is None else LAYOUTS[index])  # the candidate's own object, never the stored one


def test_the_host_runner_refuses_a_kernel_name_that_is_not_an_identifier(tmp_path, cache_root, monkeypatch):
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # `../../../x.cpp` from a folder made here: under tmp_path
    before = _listing(tmp_path)
    x, y = np.zeros(4, np.float32), np.zeros(4, np.float32)
    args = [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data), np.uint32(4)]
    for name in ("../../../x", 'x"\n#include "/etc/passwd', "x y", ""):
        with pytest.raises(ValueError, match="expected a C identifier"):
            host_runner.launch("/* any */", name, PARAMS, (1,), (4,), args)
    assert _listing(tmp_path) == before


# =====================================================================================================================
# 4. A cache that cannot take a write
# =====================================================================================================================
SOURCE = """extern "C" __global__ void {name}(const float* x, float* y, const unsigned int n) {{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = {factor}f * x[i] + 1.0f;
}}
"""


def _run_host_kernel(name: str, factor: float) -> Path:
    x = np.arange(37, dtype=np.float32)
    y = np.zeros_like(x)
    source = SOURCE.format(name=name, factor=factor)
    host_runner.launch(source, name, PARAMS, (2,), (32,), [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data),
                                                         np.uint32(x.size)])
    assert np.array_equal(y, np.float32(factor) * x + 1)
    return host_runner.load_kernel(source, name, PARAMS).path


@needs_host
def test_a_full_disk_leaves_the_host_runner_running_with_one_warning(cache_root, monkeypatch):
    monkeypatch.setattr(host_runner, "_private_headers", {})
    monkeypatch.setattr(host_runner, "_unavailable_headers", set())
    write = store._write_atomically

    def full_disk(path: Path, data: bytes) -> None:  # the cache's disk is full; other disks are not
        if Path(path).is_relative_to(cache_root):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, data)

    monkeypatch.setattr(store, "_write_atomically", full_disk)
    salt = os.urandom(4).hex()  # a kernel no earlier test loaded into this process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _run_host_kernel(f"full_disk_a_{salt}", 3.0)
        second = _run_host_kernel(f"full_disk_b_{salt}", 4.0)
    (message,) = _cache_warnings(caught)
    assert "No space left on device" in message and str(cache_root / "host") in message
    assert first.parent == second.parent and not first.is_relative_to(cache_root) and _mode(first.parent) == 0o700
    assert not list(cache_root.rglob("*.so")) and not list(cache_root.rglob("*.gch"))


@needs_host
def test_a_link_in_place_of_the_shim_folder_is_not_followed(tmp_path, cache_root, monkeypatch):

    monkeypatch.setattr(host_runner, "_private_headers", {})
    monkeypatch.setattr(host_runner, "_unavailable_headers", set())
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, data in (("shim.h", host_runner.SHIM.encode()), ("shim.h.gch", b"a planted precompiled header")):
        store.write(outside / name, data)  # valid files of this user's: only the link itself is wrong
    kept = _listing(outside)
    digest = hashlib.sha256(f"{toolchain.identity()}\n{host_runner.SHIM}".encode()).hexdigest()
    (host_cache.cache_dir() / f"shim-{digest[:16]}").symlink_to(outside)
    assert host_runner._shim_header() is None
    assert _run_host_kernel(f"shim_link_{os.urandom(4).hex()}", 5.0).parent == cache_root / "host"
    assert _listing(outside) == kept
