"""The cache against a user who can swap it (docs/cache.md): a cache root below a folder that another user can
rename entries of (a group-writable team folder without the sticky bit) can be exchanged for their own tree at
any moment, between any two reads.

1. What is loaded is what was verified: a library is read once (through descriptors of its folder and of itself),
   checked against its sidecar, and loaded from a private copy of those bytes; a file replaced at the cache's path
   after that read is never loaded, by the host runner (ctypes) or the native path (torch.ops.load_library).
2. A root below such a folder is warned about, naming the folder.
3. A cache that cannot be used falls back to this user's persistent fallback cache, so that what one process
   builds the next one finds (the native library is built once, not by every process).

The race itself (a loop of RENAME_EXCHANGE against a loading process) runs with `--slow`.
"""
from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import profile

from autocuda.codegen.ckernel import CParam
from autocuda.toolchain import store
from autocuda.toolchain.host import cache as host_cache
from autocuda.toolchain.host import cxx as toolchain
from autocuda.toolchain.host import runner as host_runner

OTHER_UID = 4242  # a user that is not this one
IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]
HOST_MISSING = toolchain.missing()
needs_host = pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")
as_root = pytest.mark.skipif(not IS_ROOT, reason="giving a folder to another user (chown) needs root")


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root not created yet, seen as by a fresh process; this user's fallback cache beside it."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "fallback_root", lambda: tmp_path / "fallback")
    _fresh_process(monkeypatch)
    return tmp_path / "cache"


def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_accepted", {})
    monkeypatch.setattr(store, "_fallbacks", {})
    monkeypatch.setattr(store, "_exposed_warned", set())
    monkeypatch.setattr(host_cache, "_scratch", {})


def _cache_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, store.CacheWarning)]


def _library(tmp_path: Path, answer: int) -> bytes:
    """A tiny shared library whose `answer()` returns `answer`, built with the host compiler."""
    source, built = tmp_path / f"answer{answer}.cpp", tmp_path / f"answer{answer}.so"
    source.write_text(f'extern "C" __attribute__((visibility("default"))) int answer() {{ return {answer}; }}\n')
    subprocess.run([*toolchain.compiler(), *toolchain.CXX_FLAGS, "-o", str(built), str(source)], check=True)
    return built.read_bytes()


def _swap_after_reading(monkeypatch: pytest.MonkeyPatch, library: Path, planted: bytes) -> list[Path]:
    """Once the library's checksum has been read (the read that verifies it), replace the library and its checksum
    at their paths by `planted` and its matching checksum: what a swap of the cache root shows a second open by
    path. The paths replaced are listed."""
    read = store._read_private
    swapped: list[Path] = []

    def reading(path, *rest, **named):
        data = read(path, *rest, **named)
        if Path(path).name == library.name + store.SIDECAR and not swapped:
            store.write(library, planted)
            swapped.append(library)
        return data

    monkeypatch.setattr(store, "_read_private", reading)
    return swapped


# =====================================================================================================================
# 1. What is loaded is what was verified
# =====================================================================================================================

@needs_host
def test_distinct_libraries_load_as_themselves_and_the_same_one_once(tmp_path, cache_root):
    first, second = _library(tmp_path, 11), _library(tmp_path, 22)
    for _ in range(2):  # the loader keeps a library per name: each copy must have a name of its own
        assert host_cache.open_library(first, ctypes.CDLL).answer() == 11
        assert host_cache.open_library(second, ctypes.CDLL).answer() == 22
    assert host_cache.open_library(first, ctypes.CDLL) is host_cache.open_library(first, ctypes.CDLL)
    # The folder may hold what the compiler reads (private_copies, made by other tests of this process); the
    # copies a library is loaded from are named <digest>.so and live only while it is opened
    left = [p for p in host_cache.private_folder().iterdir() if p.suffix == ".so"]
    assert not left, "a private copy was left behind"


@needs_host
def test_a_host_library_replaced_after_its_verification_is_not_loaded(tmp_path, cache_root, monkeypatch):
    params = (CParam("x", "float", True, True), CParam("y", "float", True, False),
              CParam("n", "unsigned int", False, True))
    name = f"swapped_{os.urandom(4).hex()}"  # a library no earlier test loaded into this process

    def source(factor: float) -> str:
        return (f'extern "C" __global__ void {name}(const float* x, float* y, const unsigned int n) {{\n'
                f"    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (i < n) y[i] = {factor}f * x[i] + 1.0f;\n}}\n")

    def built(factor: float) -> tuple[str, bytes]:
        unit = host_runner.translation_unit(source(factor), name, params)
        out = tmp_path / f"{name}_{factor}.so"
        host_runner._compile(unit, source(factor), name, out)
        return host_runner._digest(unit), out.read_bytes()

    monkeypatch.setattr(host_runner, "_shim_header", lambda shim=None: None)  # seconds to build; not what is tested
    key, verified = built(3.0)
    _, planted = built(5.0)  # the same kernel name, another body: what the other user puts in its place
    (library,) = host_cache.store_library([key], verified)
    swapped = _swap_after_reading(monkeypatch, library, planted)
    x = np.arange(7, dtype=np.float32)
    y = np.zeros_like(x)
    host_runner.launch(source(3.0), name, params, (1,), (32,),
                       [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data), np.uint32(x.size)])
    assert swapped == [library] and library.read_bytes() == planted  # the swap happened, and passes a re-check
    assert np.array_equal(y, 3 * x + 1), "the library loaded is not the one verified"


@needs_host
def test_the_native_library_is_loaded_from_the_bytes_verified(tmp_path, cache_root, monkeypatch):
    pytest.importorskip("torch")
    from autocuda.call import native

    verified, planted = _library(tmp_path, 1), _library(tmp_path, 2)
    (library,) = host_cache.store_library([f"native-{os.urandom(8).hex()}"], verified)
    _swap_after_reading(monkeypatch, library, planted)
    loaded: list[bytes] = []
    monkeypatch.setattr(native, "_open_library", lambda path: loaded.append(Path(path).read_bytes()))
    for name in ("_state", "_OPERATORS"):  # _load records what it loaded (here: no operators, so unavailable)
        monkeypatch.setattr(native, name, type(getattr(native, name))(getattr(native, name)))
    monkeypatch.setattr(native, "_CALL", native._CALL)
    native._load(library)
    assert loaded == [verified] and library.read_bytes() == planted


def test_a_library_that_fails_its_checks_when_loaded_is_refused_naming_it(tmp_path, cache_root):
    library = host_cache.cache_dir() / "x.so"
    store.write(library, b"\x7fELF the user's library")
    library.write_bytes(b"\x7fELF changed since")
    opened: list[str] = []
    with pytest.raises(OSError, match=f"{library}.*does not match its checksum"):
        host_cache.open_verified(library, opened.append)
    library.unlink()
    library.symlink_to(tmp_path / "elsewhere.so")
    with pytest.raises(OSError):
        host_cache.open_verified(library, opened.append)
    assert not opened


def test_a_file_is_read_only_in_a_folder_of_this_users(tmp_path, cache_root):
    folder = host_cache.cache_dir()
    store.write(folder / "x.so", b"data")
    assert store.verified_bytes(folder / "x.so") == b"data"  # control
    folder.chmod(0o777)
    with pytest.raises(store.UnsafeCachePath, match="writable by group or others"):
        store.verified_bytes(folder / "x.so")


# =====================================================================================================================
# 2. A root that another user can swap
# =====================================================================================================================

def _stat(mode: int, uid: int | None = None) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 1, 1, 1, os.geteuid() if uid is None else uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(("mode", "uid", "problem"), [
    (0o2775, None, "writable by group or others without the sticky bit (mode 2775)"),
    (0o777, None, "writable by group or others without the sticky bit (mode 0777)"),
    (0o1777, None, None),  # /tmp: others can rename only their own entries
    (0o755, None, None),
    (0o755, 0, None),  # root's
    (0o755, OTHER_UID, f"owned by uid {OTHER_UID}"),
    (0o1777, OTHER_UID, f"owned by uid {OTHER_UID}"),  # the sticky bit does not bind a folder's owner
])
def test_exposure_rules(mode, uid, problem):
    found = store.exposure(_stat(mode, uid))
    assert found == problem if problem is None else problem in found


@pytest.mark.parametrize(("mode", "owner", "problem"), [
    (0o2775, None, "without the sticky bit (mode 2775)"),
    (0o3775, None, None),
    pytest.param(0o755, OTHER_UID, f"owned by uid {OTHER_UID}", marks=as_root),
])
def test_a_root_below_a_folder_others_can_rename_in_is_warned_about_once(tmp_path, monkeypatch, mode, owner,
                                                                        problem):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(mode)
    if owner is not None:
        os.chown(team, owner, owner)
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(team / "cache"))
    _fresh_process(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.save("kernels", "entry", b"data")
        store.save("specs", "entry", b"data")
        _fresh_process_keeping_warnings(monkeypatch)
        assert store.read("kernels", "entry") == b"data"  # used, not refused
    messages = _cache_warnings(caught)
    if problem is None:
        assert messages == []
    else:
        (message,) = messages
        assert f"below {team}," in message and problem in message and "AUTOCUDA_CACHE_DIR" in message
    assert store.root() == team / "cache"


def _fresh_process_keeping_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_accepted", {})
    monkeypatch.setattr(store, "_fallbacks", {})


# =====================================================================================================================
# 3. A cache that cannot be used
# =====================================================================================================================

def _unwritable(tmp_path: Path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return blocker / "cache"  # nothing can be created below a file (EACCES and EROFS do not bind root)


def test_an_unwritable_cache_falls_back_to_this_users_persistent_fallback(tmp_path, cache_root, monkeypatch):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(_unwritable(tmp_path)))
    fallback = tmp_path / "fallback"
    for process in range(2):
        _fresh_process(monkeypatch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if process == 0:
                store.save("binaries", "probe", b"image")
            assert store.read("binaries", "probe") == b"image"  # the second process finds the first one's
            assert store.root() == fallback and store.folder("host") == fallback / "host"
        (message,) = _cache_warnings(caught)
        assert "not writable" in message and f"{fallback} (this user's fallback cache" in message
    assert stat.S_IMODE(os.lstat(fallback).st_mode) == 0o700


def _shared_fallback(fallback: Path) -> None:
    fallback.mkdir(mode=0o700)
    fallback.chmod(0o777)  # another user could plant entries there


def _linked_fallback(fallback: Path) -> None:
    """The name taken first by another user, as a link to a folder of yours (resolving the path with realpath
    would follow it: protected_symlinks binds opening through a link, not readlink)."""
    (fallback.parent / "yours").mkdir(mode=0o700)
    fallback.symlink_to(fallback.parent / "yours")


@pytest.mark.parametrize("take", [_shared_fallback, _linked_fallback], ids=["world-writable", "a link"])
def test_a_refused_fallback_gives_a_temporary_folder(tmp_path, cache_root, monkeypatch, take):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(_unwritable(tmp_path)))
    take(tmp_path / "fallback")
    with pytest.warns(store.CacheWarning, match="private, temporary") as caught:
        used = store.folder("kernels")
    assert not used.is_relative_to(tmp_path) and "fallback cache" not in str(caught[0].message)
    assert not any((tmp_path / "yours").glob("*")), "the cache went where the link points"


def test_a_library_built_with_an_unwritable_cache_is_found_by_the_next_process(tmp_path):
    """What every process with an unwritable cache did with the native library (25 s each): build it into a
    folder of its own that went when it exited, and leave the next process to build it again."""
    probe = textwrap.dedent("""
        from autocuda.toolchain.host import cache
        path, cached = cache.load_or_build("probe", lambda out: out.write_bytes(b"a library"))
        print("disk" if cached else "built")
    """)
    (tmp_path / "tmp").mkdir(mode=0o700)
    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(_unwritable(tmp_path)), "TMPDIR": str(tmp_path / "tmp"),
                        "PYTHONPATH": str(REPO), "AUTOCUDA_NATIVE": "0"}

    def run() -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip(), done.stderr

    runs = [run(), run()]
    assert [found for found, _ in runs] == ["built", "disk"]
    assert all("not writable" in said and "fallback cache, kept between processes" in said for _, said in runs)
    assert list((tmp_path / "tmp" / f"autocuda-{os.geteuid()}" / "host").glob("*.so"))


# =====================================================================================================================
# The race (slow): another user's tree swapped in and out while libraries load
# =====================================================================================================================

def _exchange() -> Callable[[Path, Path], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        pytest.skip("no renameat2 in this C library")

    def exchange(a: Path, b: Path) -> None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, str(a).encode(), at_fdcwd, str(b).encode(), rename_exchange) != 0:
            raise OSError(ctypes.get_errno(), f"renameat2({a}, {b}, RENAME_EXCHANGE)")
    return exchange


@needs_host
@as_root
@pytest.mark.skipif(profile() != "slow", reason="a race loop: runs with --slow")
def test_a_root_swapped_in_a_loop_never_gets_its_library_loaded(tmp_path, cache_root, monkeypatch):
    exchange = _exchange()
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2775)
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(team / "cache"))
    keys = [f"race{i:04d}" for i in range(1000)]
    ours, theirs = [_library(tmp_path, 1), _library(tmp_path, 2)], _library(tmp_path, 99)
    with pytest.warns(store.CacheWarning, match="sticky"):
        for i, key in enumerate(keys):
            host_cache.store_library([key], ours[i % 2])
    planted = team / "planted"  # the other user's tree: the same names, with matching checksums
    (planted / "host").mkdir(parents=True)
    for key in keys:
        store.write(planted / "host" / f"{key}.so", theirs)
    for path in [planted, *planted.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            exchange(team / "cache", planted)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    loaded = []
    try:
        for i, key in enumerate(keys):
            try:
                loaded.append((i, host_cache.open_verified(host_cache.cache_dir() / f"{key}.so", ctypes.CDLL)))
            except OSError:
                continue  # the swapped-in tree is refused: rebuilt by the host runner, never loaded
    finally:
        stop.set()
        swapper.join()
    assert loaded, "no load got through"
    assert [library.answer() for _, library in loaded] == [i % 2 + 1 for i, _ in loaded]


@pytest.mark.skipif(os.name != "posix", reason="fcntl locks")
def test_the_native_build_lock_does_not_follow_a_link(tmp_path, cache_root):
    from autocuda.call import native

    target = tmp_path / "elsewhere"
    (host_cache.cache_dir() / ".native-build.lock").symlink_to(target)
    with pytest.raises(OSError), native._build_lock(wait=True):
        pass
    assert not os.path.lexists(target)
