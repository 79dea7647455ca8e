"""The on-disk cache of compiled host libraries: `<key>.so` in `autocuda.store`'s `host` folder, with the
store's checksum sidecar (a library that does not match it is rebuilt, never loaded)."""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from .. import store


def cache_dir() -> Path:
    """$AUTOCUDA_CACHE_DIR/host (default ~/.cache/autocuda/host); a temporary folder if that is unwritable."""
    return store.folder("host")


def _verified(library: Path) -> bool:
    return store.verified(library)


def load_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The path of library `key` and whether it came from the cache; `build(path)` writes a fresh one."""
    library = cache_dir() / f"{key}.so"
    if store.verified(library):
        return library, True
    with tempfile.TemporaryDirectory(prefix="autocuda-build-") as folder:
        built = Path(folder) / "kernel.so"
        build(built)
        data = built.read_bytes()
    store.write(library, data)
    return library, False
