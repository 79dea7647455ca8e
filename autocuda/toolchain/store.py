"""autocuda's disk cache: files under $AUTOCUDA_CACHE_DIR (default ~/.cache/autocuda), one folder per kind.

Kinds: `host` (host-runner libraries), `kernels` (generated kernel sources and parameter lists), `binaries`
(compiled GPU code), `specs` (specs known to parse), `tuning` (the layouts timed fastest for long loops).
`autocuda cache` shows what is stored; `autocuda cache --clear` removes it.

What is read from the cache becomes code that runs, so the cache is private to its user (docs/cache.md):
- the root is resolved once (symbolic links on the way to it are followed) and must be a directory owned by this
  user and not writable by group or others; it is created with mode 0700 whatever the umask. A folder above it
  that another user could rename entries of (writable by group or others without the sticky bit, or owned by
  another user but root) gets one warning naming it: that user can swap the root for a tree of their own;
- inside the root nothing is followed: a kind folder (or a subfolder such as the host runner's shim folder) must be
  a real directory passing the same checks, and files are opened with O_NOFOLLOW and must be regular files of
  this user's, not writable by group or others;
- a file is read once, through a descriptor of its folder (opened without following a link, and checked as a
  folder is) and one of its own, together with its sidecar from the same folder; what is verified is the bytes
  read, and those bytes are what is used (`verified_bytes`): a library is loaded from them, never opened again by
  its name (`autocuda.toolchain.host.cache.open_library`);
- a refused or unwritable root or kind folder is replaced by this user's fallback cache (`autocuda-<uid>` in the
  temporary folder, kept between processes and checked like a root), with one warning naming the folder and the
  reason; where that fails too, by a private temporary folder of this process.
A file is written atomically (a temporary file of mode 0600 in the same folder, then os.replace) together with a
sidecar holding the sha256 of its bytes; a file whose bytes do not match its sidecar (truncated, corrupted,
half-written by an older version) counts as missing and is rebuilt, never used.
Entries that depend on how autocuda generates code are named by `key`, which hashes `code_fingerprint()`: a
changed generator never reads an older generator's entries.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from ..base.errors import CacheWarning, UnsafeCachePath

KINDS = ("specs", "kernels", "binaries", "tuning", "host")
FOLDER_MODE = 0o700
ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # a plain file name: no separator, not hidden
SIDECAR = ".sha256"
# Reading never follows a symbolic link, never blocks on a FIFO, and leaks no descriptor into compilers it starts.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_POSIX = os.name == "posix"  # owners and mode bits mean something (elsewhere the folder's ACLs decide)

_accepted: dict[Path, Path] = {}   # a folder asked for -> the checked folder used (checked once per process)
_fallbacks: dict[Path, Path] = {}  # a refused or unwritable folder -> the folder used in its place
_exposed_warned: set[Path] = set()  # folders above a root already warned about in this process


def _uid() -> int:
    return os.geteuid()


def _own(st: os.stat_result) -> bool:
    return not _POSIX or st.st_uid == _uid()


def _not_shared(st: os.stat_result) -> bool:
    return not _POSIX or not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# A rule: the test of a stat result, the error raised when it fails, and what that error says.
_Rules = tuple[tuple[Callable[[os.stat_result], bool], type[OSError], str], ...]
# What a folder of the cache must be, tested on its lstat (a symbolic link is refused, never followed); a
# directory that is not one is unusable (as an unwritable folder is) rather than unsafe.
_FOLDER_RULES: _Rules = (
    (lambda st: not stat.S_ISLNK(st.st_mode), UnsafeCachePath, "is a symbolic link (never followed in the cache)"),
    (lambda st: stat.S_ISDIR(st.st_mode), NotADirectoryError, "is not a directory"),
    (_own, UnsafeCachePath, "is owned by uid {uid}, not by this user (uid {me})"),
    (_not_shared, UnsafeCachePath, "is writable by group or others (mode {mode:03o})"),
)
# What a file read from the cache must be, tested on the descriptor opened without following a link.
_FILE_RULES: _Rules = (
    (lambda st: stat.S_ISREG(st.st_mode), UnsafeCachePath, "is not a regular file"),
    (_own, UnsafeCachePath, "is owned by uid {uid}, not by this user (uid {me})"),
    (_not_shared, UnsafeCachePath, "is writable by group or others (mode {mode:03o})"),
)


def _problem(st: os.stat_result, rules: _Rules) -> tuple[type[OSError], str] | None:
    """The error and the reason of the first rule `st` breaks, or None."""
    for test, error, message in rules:
        if not test(st):
            return error, message.format(uid=st.st_uid, me=_uid() if _POSIX else "-", mode=stat.S_IMODE(st.st_mode))
    return None


def _check(path: Path, st: os.stat_result, rules: _Rules) -> None:
    found = _problem(st, rules)
    if found is not None:
        error, problem = found
        raise UnsafeCachePath(path, problem) if error is UnsafeCachePath else error(f"{path} {problem}")


def folder_problem(st: os.stat_result) -> str | None:
    """Why a folder with this lstat cannot hold cache entries, or None if it can."""
    found = _problem(st, _FOLDER_RULES)
    return None if found is None else found[1]


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user controls: created with mode 0700 when missing; an OSError naming the path
    and the reason when it cannot be made, and UnsafeCachePath when it is a symbolic link, another user's, or
    writable by group or others."""
    try:
        os.mkdir(path, FOLDER_MODE)  # the umask can take bits away, never add them
        if stat.S_IMODE(os.lstat(path).st_mode) != FOLDER_MODE:
            os.chmod(path, FOLDER_MODE)  # a umask that took the owner's own bits away
    except FileExistsError:
        pass
    _check(path, os.lstat(path), _FOLDER_RULES)
    return path


def temporary_folder(what: str) -> Path:
    """A new private folder (mode 0700) for this process, removed when it exits."""
    path = Path(tempfile.mkdtemp(prefix=f"autocuda-{what}-"))
    atexit.register(_remove_own_temporary, path, os.getpid())
    return path


def _remove_own_temporary(path: Path, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # a forked child leaves its parent's folder alone
        shutil.rmtree(path, ignore_errors=True)


def configured_root() -> Path:
    """The cache root as configured, before it is resolved and checked."""
    return Path(os.environ.get("AUTOCUDA_CACHE_DIR") or Path.home() / ".cache" / "autocuda")


def fallback_root() -> Path:
    """This user's cache where the configured one is refused or unwritable: `autocuda-<uid>` in the temporary
    folder (tempfile.gettempdir(), $TMPDIR, resolved), kept between processes so that what one builds the next one
    finds. Anyone can create that name first: it is checked as any cache folder is, a link in its place refused."""
    return Path(os.path.realpath(tempfile.gettempdir())) / (f"autocuda-{_uid()}" if _POSIX else "autocuda")


def _private_root(configured: Path) -> Path:
    """The configured root resolved (links followed), missing folders on the way created 0700, then checked; one
    warning for a folder above it that another user could rename entries of."""
    resolved = Path(os.path.realpath(configured))
    for parent in reversed(resolved.parents):
        if not os.path.lexists(parent):
            private_folder(parent)
    private_folder(resolved)
    _warn_exposed(resolved)
    return resolved


def exposure(st: os.stat_result) -> str | None:
    """Why another user could rename the entries of a folder with this stat (and so swap a cache below it for
    their own), or None: writable by group or others without the sticky bit, or owned by another user but root."""
    if not _POSIX:
        return None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"is writable by group or others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_uid not in (0, _uid()):
        return f"is owned by uid {st.st_uid}, who can rename what it holds"
    return None


def _warn_exposed(resolved: Path) -> None:
    """One warning (per folder and process) for the first folder above the root that another user controls."""
    for parent in resolved.parents:
        try:
            problem = exposure(os.stat(parent))
        except OSError:  # a folder that cannot be looked at (it was just passed through): nothing to say
            continue
        if problem is not None:
            if parent not in _exposed_warned:
                _exposed_warned.add(parent)
                warnings.warn(f"autocuda: cache root {resolved} is below {parent}, which {problem}: another user "
                              "can swap the cache for a folder of their own between two reads. autocuda uses only "
                              "what it verified and loads libraries from private copies, but the cache may stop "
                              "working or be filled by others; set AUTOCUDA_CACHE_DIR to a folder under folders "
                              "only you (or root) can write", CacheWarning, stacklevel=5)
            return


def _writable(path: Path) -> Path:
    # A real write: os.access says yes to root even on read-only mounts.
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
        pass
    return path


def _use(wanted: Path, what: str, check: Callable[[], Path]) -> Path:
    """`check()`'s folder for `wanted`, checked once per process; where it fails, the fallback (`_fallback`),
    with one warning naming the folder, the reason and the folder used instead."""
    found = _accepted.get(wanted) or _fallbacks.get(wanted)
    if found is not None:
        return found
    try:
        found = _accepted[wanted] = check()
        return found
    except OSError as error:
        fallback, persistent = _fallback(what)
        _fallbacks[wanted] = fallback
        warnings.warn(_refusal(wanted, what, error, fallback, persistent), CacheWarning, stacklevel=3)
        return fallback


def _fallback(what: str) -> tuple[Path, bool]:
    """The folder in place of a refused or unwritable root (`what` "cache") or kind folder, and whether it is kept
    between processes: this user's fallback root (or its kind folder), checked as a root is; where that is
    refused or unwritable too, a private temporary folder of this process."""
    try:
        persistent = _writable(private_folder(fallback_root()))
        _warn_exposed(persistent)
        return (_writable(private_folder(persistent / what)) if what in KINDS else persistent), True
    except OSError:
        return temporary_folder(what), False


def _refusal(wanted: Path, what: str, error: OSError, fallback: Path, persistent: bool) -> str:
    kept = ("this user's fallback cache, kept between processes" if persistent
            else "private, temporary: removed when this process exits")
    if isinstance(error, UnsafeCachePath):
        return (f"autocuda: cache folder {wanted} is refused: {error.path} {error.problem}; this process keeps its "
                f"{what} in {fallback} ({kept}) instead. Check what that folder holds, then remove it "
                "(`autocuda cache --clear` for a kind folder) or make it yours alone (chown, chmod 700), or set "
                "AUTOCUDA_CACHE_DIR to a folder only you can write")
    return (f"autocuda: cache folder {wanted} is not writable ({error}); this process keeps its {what} in "
            f"{fallback} ({kept}) instead (set AUTOCUDA_CACHE_DIR to a writable folder)")


def root() -> Path:
    """The cache root of this process: the configured folder, resolved, checked and writable (else the fallback,
    with one warning: `_use`)."""
    configured = configured_root()
    return _use(configured, "cache", lambda: _writable(_private_root(configured)))


def folder(kind: str) -> Path:
    """The folder of one kind, checked and writable (else the fallback, with one warning: `_use`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; kinds: {', '.join(KINDS)}")
    wanted = root() / kind
    return _use(wanted, kind, lambda: _writable(private_folder(wanted)))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR)


@contextlib.contextmanager
def _folder_descriptor(path: Path) -> Iterator[int | None]:
    """A descriptor of folder `path`, opened without following a link and checked as a cache folder (None where
    the platform opens no folders: files are then opened by their full path)."""
    if os.open not in os.supports_dir_fd:
        yield None
        return
    descriptor = os.open(path, _FOLDER_FLAGS)
    try:
        _check(path, os.fstat(descriptor), _FOLDER_RULES)
        yield descriptor
    finally:
        os.close(descriptor)


def _read_private(path: Path, folder_descriptor: int | None = None) -> bytes:
    """The bytes of `path` (looked up in the folder `folder_descriptor` where given), opened without following a
    symbolic link; UnsafeCachePath unless it is a regular file of this user's that group and others cannot
    write."""
    name = path if folder_descriptor is None else path.name
    with os.fdopen(os.open(name, _READ_FLAGS, dir_fd=folder_descriptor), "rb") as file:
        _check(path, os.fstat(file.fileno()), _FILE_RULES)
        return file.read()


def verified_bytes(path: Path) -> bytes:
    """The bytes of cache file `path`, read once, with its sidecar, through one descriptor of their folder (both
    checked: `_folder_descriptor`, `_read_private`), when they match the sidecar: what to use, never the file
    opened again. An OSError naming the file otherwise (UnsafeCachePath where a check fails)."""
    with _folder_descriptor(path.parent) as folder_descriptor:
        data = _read_private(path, folder_descriptor)
        try:
            recorded = _read_private(_sidecar(path), folder_descriptor).strip()
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} has no checksum ({_sidecar(path).name})") from None
    if recorded != digest(data).encode():
        raise OSError(f"{path} does not match its checksum ({_sidecar(path).name})")
    return data


def _checked_bytes(path: Path) -> bytes | None:
    """The file's bytes when they match its sidecar; None when either is missing, unsafe or mismatched."""
    try:
        return verified_bytes(path)
    except OSError:  # missing, refused or unreadable (a damaged sidecar, even one not valid text, just mismatches)
        return None


def verified(path: Path) -> bool:
    """The file exists, passes the file checks, and its bytes match its sidecar."""
    return _checked_bytes(path) is not None


def _write_atomically(path: Path, data: bytes) -> None:
    private_folder(path.parent)  # recreated if removed since it was checked; refused if no longer private
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)  # replaces a link or file at `path` itself, never what a link points to
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write(path: Path, data: bytes) -> None:
    """The file first, then its checksum: a reader between the two sees a mismatch and rebuilds."""
    _write_atomically(path, data)
    _write_atomically(_sidecar(path), digest(data).encode())


def write_name(path: Path, existing: Path, data: bytes) -> None:
    """`path` as a further name (a hard link) of the file `existing`, which was written with `data`, and its own
    checksum; a copy where the file system takes no links. Should `existing` have been replaced in between, the
    checksum no longer matches and the entry is rebuilt, never used."""
    private_folder(path.parent)
    temporary = path.with_name(f".{path.name}.{os.urandom(8).hex()}")
    try:
        os.link(existing, temporary, follow_symlinks=False)
    except OSError:
        write(path, data)
        return
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _write_atomically(_sidecar(path), digest(data).encode())


def _entry(kind: str, name: str) -> Path:
    if not isinstance(name, str) or not ENTRY_NAME.match(name) or name.endswith(SIDECAR):
        raise ValueError(f"cache entry name {name!r}: expected a file name of letters, digits, '_', '.', '-' "
                         f"(not starting with '.', not ending in {SIDECAR!r}, at most 128 characters)")
    return folder(kind) / name


def read(kind: str, name: str) -> bytes | None:
    """An entry's bytes, or None when it is missing, fails the file checks, or fails its checksum."""
    return _checked_bytes(_entry(kind, name))


def save(kind: str, name: str, data: bytes) -> None:
    """Store an entry; a failed write only costs the next process a rebuild."""
    path = _entry(kind, name)
    try:
        write(path, data)
    except OSError as error:
        warnings.warn(f"autocuda: could not write {kind} cache entry {name} ({error})", CacheWarning, stacklevel=2)


# The parts of the package that decide generated code and how kernels are compiled, tuned and launched: what
# `code_fingerprint` hashes. A folder stands for every file under it (renames inside it need no edit here).
GENERATOR = ("spec", "codegen", "toolchain", "runtime/__init__.py", "runtime/configs.py", "runtime/neuron_launch.py",
             "runtime/records.py", "runtime/tuning.py")
# The rest of the package: it runs or reports kernels without changing what is generated, compiled or tuned, so
# editing it keeps every cached entry. A new module goes in one of the two tables (tests/test_fingerprint.py).
NOT_GENERATOR = ("runtime/reference.py", "__init__.py", "__main__.py", "tools", "base", "call", "nn")
GENERATOR_SUFFIXES = (".py", ".h", ".j2")  # source, the host runner's shim header, templates


def generator_files(package: Path) -> list[Path]:
    """The files of the GENERATOR table under `package` (the templates are codegen's)."""
    entries = [package / entry for entry in GENERATOR]
    found = [path for entry in entries for path in ([entry] if entry.is_file() else sorted(entry.rglob("*")))]
    return [path for path in found if path.suffix in GENERATOR_SUFFIXES and path.is_file()]


def fingerprint(package: Path) -> str:
    """A digest of the generator's files (their paths and bytes)."""
    h = hashlib.sha256()
    for path in generator_files(package):
        name = path.relative_to(package).as_posix()
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def code_fingerprint() -> str:
    """The fingerprint of this installation's generator: cached entries are named under it (`key`)."""
    return fingerprint(Path(__file__).resolve().parents[1])


def key(text: str) -> str:
    """An entry name for `text` under this version of the code generator."""
    return digest(f"{code_fingerprint()}\n{text}".encode())[:40]


def _entries(path: Path) -> list[os.stat_result]:
    """The stat of each entry of a kind folder (regular files, not hidden, not checksums); none in a symbolic link
    or anything else that is not a directory."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        return []
    with os.scandir(path) as found:
        return [item.stat(follow_symlinks=False) for item in found if item.is_file(follow_symlinks=False)
                and not item.name.startswith(".") and not item.name.endswith(SIDECAR)]


def usage() -> list[tuple[str, int, int]]:
    """(kind, entries, bytes) of each kind with a folder (or anything else of its name) under the cache root; a file
    stored under several names (a host group's library, linked under each kernel's key) counts its bytes once."""
    out = []
    for kind in KINDS:
        try:
            entries = _entries(root() / kind)
        except FileNotFoundError:
            continue
        files = {(entry.st_dev, entry.st_ino): entry.st_size for entry in entries}
        out.append((kind, len(entries), sum(files.values())))
    return out


def clear() -> int:
    """Remove every kind's folder under the cache root (a symbolic link in a folder's place is removed, never
    followed); the number of entries removed."""
    removed = 0
    for kind, entries, _ in usage():
        path = root() / kind
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
        _accepted.pop(path, None)
        _fallbacks.pop(path, None)
        removed += entries
    return removed
