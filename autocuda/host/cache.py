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
from collections.abc import Callable
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


def load_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The path of library `key` and whether it came from a cache; `build(path)` writes a fresh one."""
    folder = cache_dir()
    library = folder / f"{key}.so"
    stored = [library, _scratch[folder] / library.name] if folder in _scratch else [library]
    for found in stored:
        if store.verified(found):
            return found, True
    data = _built(build)
    if folder not in _scratch:
        try:
            store.write(library, data)
            return library, False
        except OSError as error:  # ENOSPC, EROFS, EACCES, a folder refused: degrade, never fail the launch
            _scratch_folder(folder, error)
    library = _scratch[folder] / library.name
    store.write(library, data)
    return library, False
