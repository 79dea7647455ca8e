"""The on-disk cache of compiled host libraries: `<key>.so` in `autocuda.toolchain.store`'s `host` folder, with the
store's checksum sidecar (a library that does not match it, or fails the store's owner and mode checks, is
rebuilt, never loaded).

A library is loaded from bytes this process holds, never from the cache by its name (`open_library`): the bytes
read and verified from the cache in one read (`store.verified_bytes`), or those it just built. They are copied
into memory that only this process reaches (a sealed memfd, or a file in a private folder of this process) and
loaded from there, so whatever replaces the cache's file, or a folder above it, after the read is never loaded.

Where a library cannot be written into the cache (a full disk, a read-only mount, a folder refused since it was
checked), it is written into a private folder of this process instead (one warning): the process keeps running.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .. import store

T = TypeVar("T")

_scratch: dict[Path, Path] = {}  # a cache folder that refused a write -> this process's private folder instead
_opened: dict[tuple[str, Any], Any] = {}  # (digest of a library's bytes, opener) -> what the opener returned
_opening = threading.Lock()
_private: dict[int, Path] = {}  # a process id -> that process's private folder (made on first use)
# A memfd's contents can no longer change once sealed: what was verified is what the loader maps.
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")
_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def _forget_opening() -> None:
    """In a forked child: the thread that held the parent's lock (a library being opened) does not exist there; a
    lock held at the fork would never be released."""
    global _opening
    _opening = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_opening)


def cache_dir() -> Path:
    """$AUTOCUDA_CACHE_DIR/host (default ~/.cache/autocuda/host), checked; the store's fallback if that is refused
    or unwritable."""
    return store.folder("host")


def _verified(library: Path) -> bool:
    return store.verified(library)


def private_folder() -> Path:
    """A folder of this process's that no one else can write (mode 0700, made by mkdtemp, removed when the
    process exits; a forked child makes its own): private copies of what is loaded or compiled from the cache."""
    pid = os.getpid()
    if pid not in _private or not os.path.isdir(_private[pid]):
        _private[pid] = store.temporary_folder("private")
    return _private[pid]


def _built(build: Callable[[Path], None]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="autocuda-build-") as folder:
        built = Path(folder) / "kernel.so"
        build(built)
        return built.read_bytes()


def _scratch_folder(cache: Path, error: OSError) -> Path:
    """This process's private folder for libraries the cache folder `cache` would not take (made, and warned
    about, once)."""
    if cache not in _scratch:
        _scratch[cache] = store.temporary_folder("host")
        warnings.warn(f"autocuda: could not write a host library into {cache} ({error}); this process builds them "
                      f"in {_scratch[cache]} (private, temporary) instead", store.CacheWarning, stacklevel=4)
    return _scratch[cache]


def _stored(key: str) -> list[Path]:
    """Where library `key` may be: the cache folder, then this process's scratch folder for it."""
    folder = cache_dir()
    library = folder / f"{key}.so"
    return [library, _scratch[folder] / library.name] if folder in _scratch else [library]


def cached(key: str) -> tuple[Path, bytes] | None:
    """The path and the verified bytes of library `key` (in the cache folder, or this process's scratch folder),
    or None."""
    for path in _stored(key):
        try:
            return path, store.verified_bytes(path)
        except OSError:
            continue
    return None


def find(key: str) -> Path | None:
    """The verified library `key` (in the cache folder, or this process's scratch folder), or None."""
    found = cached(key)
    return None if found is None else found[0]


def obtain(key: str, build: Callable[[Path], None]) -> tuple[Path, bytes, bool]:
    """Library `key`: its path, the bytes to load, and whether it came from a cache; `build(path)` writes a fresh
    one (then stored, and its bytes as built are the ones to load)."""
    found = cached(key)
    if found is not None:
        return *found, True
    data = _built(build)
    return store_library([key], data)[0], data, False


def load_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The path of library `key` and whether it came from a cache; `build(path)` writes a fresh one."""
    path, _, from_cache = obtain(key, build)
    return path, from_cache


def build_shared(keys: Sequence[str], build: Callable[[Path], None]) -> tuple[list[Path], bytes]:
    """One library holding several kernels, written by `build(path)`, stored under each kernel's key: the paths,
    and the bytes to load."""
    data = _built(build)
    return store_library(keys, data), data


def store_library(keys: Sequence[str], data: bytes) -> list[Path]:
    """The library `data` stored under each key (one file, the other keys further names of it); the paths."""
    folder = cache_dir()
    if folder not in _scratch:
        try:
            return _write_names(folder, keys, data)
        except OSError as error:  # ENOSPC, EROFS, EACCES, a folder refused: degrade, never fail the launch
            _scratch_folder(folder, error)
    return _write_names(_scratch[folder], keys, data)


def _write_names(folder: Path, keys: Sequence[str], data: bytes) -> list[Path]:
    libraries = [folder / f"{key}.so" for key in keys]
    store.write(libraries[0], data)
    for library in libraries[1:]:
        store.write_name(library, libraries[0], data)
    return libraries


def open_verified(library: Path, opener: Callable[[str], T]) -> T:
    """`open_library` of the bytes of cache file `library` as read and verified once (`store.verified_bytes`);
    an OSError naming the file where they fail a check."""
    return open_library(store.verified_bytes(library), opener)


def open_library(data: bytes, opener: Callable[[str], T]) -> T:
    """`opener(path)` (ctypes.CDLL, torch.ops.load_library) on a private copy of the library `data`: the loader
    maps those bytes, whatever happens in the cache meanwhile. Each library is opened once per opener and process
    (keyed by the digest of its bytes; the copy is named by it too, as the loader keeps a library per name)."""
    key = (store.digest(data), opener)
    with _opening:
        if key not in _opened:
            with _private_copy(data, f"{key[0]}.so") as path:
                _opened[key] = opener(path)
        return _opened[key]


@contextlib.contextmanager
def _private_copy(data: bytes, name: str) -> Iterator[str]:
    """A path, named `name` in this process's private folder, whose bytes are `data` while the block runs: a link
    to a sealed memfd (no file on disk, nothing another process can write; a mount of the temporary folder
    without exec rights does not matter), or where there are none a file of mode 0700 in that folder."""
    path = private_folder() / name
    if not _MEMFD:
        if not path.exists():  # this folder is this process's alone: a file of this name holds these bytes
            _write_new(path, data, 0o700)
        yield str(path)
        return
    import fcntl

    descriptor = os.memfd_create(name, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    try:
        _write_all(descriptor, data)
        with contextlib.suppress(OSError, AttributeError):  # no seals: the memfd is still this process's alone
            fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, sum(getattr(fcntl, seal, 0) for seal in _SEALS))
        path.unlink(missing_ok=True)
        os.symlink(f"/proc/self/fd/{descriptor}", path)
        yield str(path)
    finally:
        path.unlink(missing_ok=True)
        os.close(descriptor)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """`data` into a file `path` that does not exist yet (never through a link, never over another file)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        _write_all(descriptor, data)
    finally:
        os.close(descriptor)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view):]


def private_copies(files: dict[str, bytes]) -> Path:
    """A new folder in this process's private folder holding `files` (name -> bytes), each written there from
    those bytes: what a compiler reads by path (the precompiled shim) without reading the cache itself."""
    folder = Path(tempfile.mkdtemp(dir=private_folder()))
    for name, data in files.items():
        _write_new(folder / name, data, 0o600)
    return folder
