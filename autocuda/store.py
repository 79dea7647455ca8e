"""autocuda's disk cache: files under $AUTOCUDA_CACHE_DIR (default ~/.cache/autocuda), one folder per kind.

Kinds: `host` (host-runner libraries), `kernels` (generated kernel sources and parameter lists), `binaries`
(compiled GPU code), `specs` (specs known to parse), `tuning` (the layouts timed fastest for long loops).
`autocuda cache` shows what is stored; `autocuda cache --clear` removes it.
A file is written atomically (a temporary file in the same folder, then os.replace) together with a sidecar
holding the sha256 of its bytes; a file whose bytes do not match its sidecar (truncated, corrupted,
half-written by an older version) counts as missing and is rebuilt, never used.
Entries that depend on how autocuda generates code are named by `key`, which hashes `code_fingerprint()`: a
changed generator never reads an older generator's entries.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from .resources import resource_dir

KINDS = ("specs", "kernels", "binaries", "tuning", "host")
_fallbacks: dict[Path, Path] = {}
_writable: set[Path] = set()  # folders found writable: probed once per process, not on every read


def root() -> Path:
    return Path(os.environ.get("AUTOCUDA_CACHE_DIR") or Path.home() / ".cache" / "autocuda")


def folder(kind: str) -> Path:
    """The folder of one kind; a temporary folder for this process (and one warning) if that is unwritable."""
    wanted = root() / kind
    if wanted in _writable:
        return wanted
    if wanted in _fallbacks:
        return _fallbacks[wanted]
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        # Try a real write: os.access says yes to root even on read-only mounts.
        with tempfile.NamedTemporaryFile(dir=wanted, prefix=".probe-"):
            pass
        _writable.add(wanted)
        return wanted
    except OSError as error:
        fallback = Path(tempfile.mkdtemp(prefix=f"autocuda-{kind}-"))
        warnings.warn(f"autocuda: cache folder {wanted} is not writable ({error}); {kind} go to {fallback} for "
                      "this process (set AUTOCUDA_CACHE_DIR to a writable folder)", stacklevel=3)
        _fallbacks[wanted] = fallback
        return fallback


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def verified(path: Path) -> bool:
    """The file exists and its bytes match its sidecar."""
    try:
        return _sidecar(path).read_bytes().strip() == digest(path.read_bytes()).encode()
    except OSError:  # missing or unreadable (a damaged sidecar, even one not valid text, just mismatches)
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # it may have been removed since `folder` probed it
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write(path: Path, data: bytes) -> None:
    """The file first, then its checksum: a reader between the two sees a mismatch and rebuilds."""
    _write_atomically(path, data)
    _write_atomically(_sidecar(path), digest(data).encode())


def read(kind: str, name: str) -> bytes | None:
    """An entry's bytes, or None when it is missing or fails its checksum."""
    path = folder(kind) / name
    try:
        data = path.read_bytes()
        return data if _sidecar(path).read_bytes().strip() == digest(data).encode() else None
    except OSError:
        return None


def save(kind: str, name: str, data: bytes) -> None:
    """Store an entry; a failed write only costs the next process a rebuild."""
    try:
        write(folder(kind) / name, data)
    except OSError as error:
        warnings.warn(f"autocuda: could not write {kind} cache entry {name} ({error})", stacklevel=2)


@functools.cache
def code_fingerprint() -> str:
    """A digest of autocuda's own code and templates: everything that decides what it generates."""
    package = Path(__file__).parent
    files = sorted([*package.rglob("*.py"), *resource_dir("templates").rglob("*.j2")])
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def key(text: str) -> str:
    """An entry name for `text` under this version of the code generator."""
    return digest(f"{code_fingerprint()}\n{text}".encode())[:40]


def usage() -> list[tuple[str, int, int]]:
    """(kind, entries, bytes) of each kind with a folder under the cache root."""
    out = []
    for kind in KINDS:
        folder = root() / kind
        if folder.is_dir():
            entries = [p for p in folder.iterdir()
                       if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".sha256")]
            out.append((kind, len(entries), sum(p.stat().st_size for p in entries)))
    return out


def clear() -> int:
    """Remove every kind's folder under the cache root; the number of entries removed."""
    removed = 0
    for kind, entries, _ in usage():
        shutil.rmtree(root() / kind)
        _writable.discard(root() / kind)
        removed += entries
    return removed
