"""The on-disk cache of compiled host libraries.

A library is stored as `<key>.so` with a sidecar `<key>.so.sha256` holding the digest of its bytes; both
are written atomically (temporary file in the same folder, then os.replace), and a library whose bytes
do not match its sidecar (truncated, corrupted, half-written by an older version) is rebuilt, never loaded.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

_fallbacks: dict[Path, Path] = {}


def cache_dir() -> Path:
    """$AUTOCUDA_CACHE_DIR/host (default ~/.cache/autocuda/host); a temporary folder if that is unwritable."""
    root = os.environ.get("AUTOCUDA_CACHE_DIR") or Path.home() / ".cache" / "autocuda"
    wanted = Path(root) / "host"
    if wanted in _fallbacks:
        return _fallbacks[wanted]
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        # Try a real write: os.access says yes to root even on read-only mounts.
        with tempfile.NamedTemporaryFile(dir=wanted, prefix=".probe-"):
            pass
        return wanted
    except OSError as error:
        fallback = Path(tempfile.mkdtemp(prefix="autocuda-host-"))
        warnings.warn(f"autocuda.host: cache folder {wanted} is not writable ({error}); compiled kernels go to "
                      f"{fallback} for this process (set AUTOCUDA_CACHE_DIR to a writable folder)", stacklevel=3)
        _fallbacks[wanted] = fallback
        return fallback


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sidecar(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _verified(library: Path) -> bool:
    try:
        return _sidecar(library).read_bytes().strip() == _digest(library.read_bytes()).encode()
    except OSError:  # missing or unreadable: rebuilt (a damaged checksum, even one not valid text, just mismatches)
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The path of library `key` and whether it came from the cache; `build(path)` writes a fresh one."""
    library = cache_dir() / f"{key}.so"
    if _verified(library):
        return library, True
    with tempfile.TemporaryDirectory(prefix="autocuda-build-") as folder:
        built = Path(folder) / "kernel.so"
        build(built)
        data = built.read_bytes()
    # The library first, then its checksum: a reader between the two sees a mismatch and rebuilds.
    _write_atomically(library, data)
    _write_atomically(_sidecar(library), _digest(data).encode())
    return library, False
