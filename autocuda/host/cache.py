"""The on-disk cache of compiled host libraries: `<key>.so` in `autocuda.store`'s `host` folder, with the
store's checksum sidecar (a library that does not match it, or fails the store's owner and mode checks, is
rebuilt, never loaded).

Where a library cannot be written into the cache (a full disk, a read-only mount, a folder refused since it was
checked), it is written into a private folder of this process instead (one warning): the process keeps running,
and the folder stays until it exits, since the library is loaded from there.
"""
from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import store

_scratch: dict[Path, Path] = {}  # a cache folder that refused a write -> this process's private folder instead


def cache_dir() -> Path:
    """$AUTOCUDA_CACHE_DIR/host (default ~/.cache/autocuda/host), checked; a temporary folder if that is refused
    or unwritable."""
    return store.folder("host")


def _verified(library: Path) -> bool:
    return store.verified(library)


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


def find(key: str) -> Path | None:
    """The verified library `key` (in the cache folder, or this process's scratch folder), or None."""
    folder = cache_dir()
    library = folder / f"{key}.so"
    stored = [library, _scratch[folder] / library.name] if folder in _scratch else [library]
    return next((found for found in stored if store.verified(found)), None)


def load_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The path of library `key` and whether it came from a cache; `build(path)` writes a fresh one."""
    found = find(key)
    if found is not None:
        return found, True
    return store_library([key], _built(build))[0], False


def build_shared(keys: Sequence[str], build: Callable[[Path], None]) -> list[Path]:
    """One library holding several kernels, written by `build(path)`, stored under each kernel's key."""
    return store_library(keys, _built(build))


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
