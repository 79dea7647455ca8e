"""The native call path: programs' neuron calls (`autocuda.call.program`) run through one C++ operator,
`autocuda_native::call`, whose autograd node is C++ as well (`neuron_call.cpp`). A small call then runs no Python
between torch and its kernel launches, in the forward or in the backward.

The library is built from `neuron_call.cpp` against the installed torch with the host's C++ compiler, once per
torch build and compiler, and kept in the disk cache's `host` folder (checksummed, private: `autocuda.toolchain.store`);
it is loaded from the bytes verified there, never opened again by its name
(`autocuda.toolchain.host.cache.open_verified`). The path is for CUDA calls: it is on for them unless
`AUTOCUDA_NATIVE=0` (or `autocuda.native.USE = False`). Calls on CPU tensors take it only where `AUTOCUDA_NATIVE` is 1
or on (`autocuda.native.HOST`): there it runs the host runner's kernels, as the Python path does, and a machine without
CUDA would build the library for nothing. A process asks for the library on its first program ready for a native plan:
it is loaded from the cache, or built by a helper process (`python -m autocuda.native`) while calls take the Python
path; the helper finishes the build where the process ends first, so that the next one finds it. A process never waits
on a build that another process started: where one holds the build lock, the helper leaves at once and the process's
calls take the Python path (the next process loads the library). Only `ensure()`, which builds and loads it now, waits
for another's build; so does `autocuda native build --wait` (without --wait it leaves a build in progress alone).
`autocuda native build` builds it ahead of time; `autocuda native` and `autocuda cache` say where it stands
(`library_state`). Without a compiler every call takes the Python path; `status()` says why.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ...toolchain import store
from ...toolchain.host import cache, cxx

SOURCE = Path(__file__).with_name("neuron_call.cpp")
VARIABLE = "AUTOCUDA_NATIVE"
_SWITCH = {"0": False, "off": False, "1": True, "on": True, "": True}
FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wno-c++20-extensions")
BUSY = 3  # the helper's exit status where another process holds the build lock: it built nothing, waited for nothing
LOCK_NAME = ".native-build.lock"  # in the host cache folder; hidden: no cache entry

_lock = threading.Lock()
# unasked -> building -> loaded | unavailable | elsewhere (another process is building it: the Python path)
_state = {"phase": "unasked", "why": "", "path": ""}
_builder: list[threading.Thread] = []
_CALL = None  # the loaded `call` operator's C++ callable
_OPERATORS: dict[str, Any] = {}  # every loaded operator's C++ callable by name (see `operator`)


def enabled() -> bool:
    """Whether $AUTOCUDA_NATIVE asks programs' calls to use the native path (unset, 1 or on: yes; 0 or off: no)."""
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value not in _SWITCH:
        raise ValueError(f"{VARIABLE}={os.environ[VARIABLE]!r}: expected 0, 1, off or on")
    return _SWITCH[value]


def on_host() -> bool:
    """Whether $AUTOCUDA_NATIVE asks for the native path on host (CPU) calls as well: only where it is 1 or on."""
    return os.environ.get(VARIABLE, "").strip().lower() in ("1", "on")


def _use_from_environment() -> bool:
    try:
        return enabled()
    except ValueError as error:
        warnings.warn(f"autocuda: {error}; the native call path stays off", RuntimeWarning, stacklevel=2)
        return False


USE = _use_from_environment()  # whether programs' CUDA calls take the native path (tests and benchmarks set it)
HOST = USE and on_host()  # whether programs' host calls take it too


def loaded() -> bool:
    """Whether the operator is loaded; the first ask starts loading it (from the cache, else a background build)."""
    if _CALL is not None:
        return True
    if _state["phase"] == "unasked":
        with _lock:
            if _state["phase"] == "unasked":
                _start()
    return _CALL is not None


def ensure() -> bool:
    """Load the operator now, waiting for its build where it is not in the cache, also for a build another process
    is running (True once loaded): the one call that waits, for tests and benchmarks that need the library."""
    loaded()
    for thread in list(_builder):
        thread.join()
    if _state["phase"] == "elsewhere" and build_into_cache(wait=True) == 0:
        found = cache.find(_key())
        if found is not None:
            _load(found)
    return _CALL is not None


def status() -> str:
    """One line: whether the native path is in use, and if not, why."""
    if _CALL is not None:
        return "loaded"
    return f"{_state['phase']}{': ' + _state['why'] if _state['why'] else ''}"


def call(plan: int, x: torch.Tensor, states: Sequence[torch.Tensor], numbers: Sequence[float]) -> list[torch.Tensor]:
    """The plan's forward outputs for x and the initial states where they are tensors ([N] each; [] where they are
    among the numbers), an autograd node recorded where the plan trains."""
    return _CALL(plan, x, states, numbers)  # type: ignore[misc]


def operator(name: str = "call") -> Callable[..., list[torch.Tensor]]:
    """An operator's C++ callable, once loaded (held by who calls it often: no Python frame in between): `call`
    (as `call` above); `layer_call` (plan, x, numbers) and `layer_call_states` (plan, x, states, numbers), a layer's
    keyed call from states of numbers or of tensors (`nn.layer_call.run_keyed`), which give the spikes in x's shape
    and the final states in its neuron shape; `op_call` (plan, x, others, numbers), an op implementation's one
    launch (`ops.NativePlans`). The last three give an empty list for tensors the plan was not made for."""
    if name not in _OPERATORS:
        raise RuntimeError(f"the native operator is not loaded ({status()})")
    return _OPERATORS[name]


class PlanNumber(int):
    """A native plan's number, as its holder keeps it: the plan lives while some holder's number does (calls in
    flight and autograd nodes keep what they use), so plans of calls no program holds any more, shapes that
    varied, say, are freed. Calls pass it as the int it is; a copy is the same holder, a pickled one a plain int."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            release = _OPERATORS.get("release_plan")
            if release is not None:
                release(int(self))
        except Exception:  # the interpreter shutting down: nothing left to free
            pass

    def __copy__(self) -> PlanNumber:
        return self

    def __deepcopy__(self, memo: dict) -> PlanNumber:
        return self

    def __reduce__(self) -> tuple:
        return int, (int(self),)


def make_plan(words: list[int], dtypes: list[torch.dtype]) -> PlanNumber:
    """The number of the plan of `words`, held by the caller until the number is dropped (`PlanNumber`)."""
    return PlanNumber(torch.ops.autocuda_native.make_plan(words, dtypes))


def live_plans() -> int:
    """How many plans some holder keeps (0 where the operator is not loaded)."""
    return int(torch.ops.autocuda_native.live_plans()) if _CALL is not None else 0


def _start() -> None:
    missing = cxx.missing_compiler()
    if missing is not None:
        return _unavailable(missing)
    key = _key()
    found = cache.find(key)
    if found is not None:
        return _load(found)
    try:  # started here, not in the thread: a process that ends at once still leaves its build running
        helper = subprocess.Popen([sys.executable, "-m", __name__], cwd=Path(__file__).parents[3],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
    except OSError as error:
        return _unavailable(f"starting the build failed: {error}")
    _state["phase"] = "building"
    thread = threading.Thread(target=_build, args=(key, helper), name="autocuda-native-build", daemon=True)
    _builder.append(thread)
    thread.start()


def _build(key: str, helper: subprocess.Popen) -> None:
    """Wait for the helper process that builds the library (`python -m autocuda.native`), then load what it
    stored. The helper runs in a session of its own: it finishes the build, for the next process, where this one
    ends first."""
    try:
        _, errors = helper.communicate()
        if helper.returncode == BUSY:  # not a failure: this process does not wait, the next one loads it
            said = errors.strip().splitlines() or ["another process is building the native library"]
            _state.update(phase="elsewhere", why=f"{said[-1]}; calls take the Python path")
            return
        found = cache.find(key)
        if found is None:
            raise RuntimeError(errors.strip()[-2000:] or f"the build exited with {helper.returncode} and stored no "
                               f"library in {cache.cache_dir()}")
        _load(found)
    except Exception as error:  # any failure leaves the Python path in place, said once
        _unavailable(f"building {SOURCE.name} failed: {error}")
        warnings.warn(f"autocuda: the native call path is unavailable ({error}); calls take the Python path",
                      RuntimeWarning, stacklevel=1)


def build_into_cache(wait: bool = False) -> int:
    """Build the library into the host cache unless it is there (what the helper process runs): 0 once it is
    there; BUSY, at once, where another process is building it and `wait` is False (nothing built; who builds on
    stderr); else 1 with the reason on stderr. One process builds at a time; the others then find its library."""
    try:
        key = _key()
        with _build_lock(wait) as builder:
            if builder is not None:
                print(f"{builder} is building the native library; this process does not wait for it",
                      file=sys.stderr)
                return BUSY
            cache.load_or_build(key, _compile)
    except Exception as error:
        print(f"autocuda: building {SOURCE.name} failed: {error}", file=sys.stderr)
        return 1
    return 0


def _load(path: Path) -> None:
    global _CALL
    try:
        cache.open_verified(path, _open_library)  # the bytes verified, never `path` opened again
        # each overload's __call__ only forwards to its C++ callable
        for name in ("layer_call", "layer_call_states", "op_call", "release_plan", "call"):
            overload = getattr(torch.ops.autocuda_native, name).default
            _OPERATORS[name] = getattr(overload, "_op", overload)
        _CALL = _OPERATORS["call"]
        _state.update(phase="loaded", why="", path=str(path))
    except Exception as error:  # a library torch refuses (another torch build): the Python path
        _unavailable(f"loading {path} failed: {error}")


def _open_library(path: str) -> None:
    """What torch.ops.load_library does (its operators register as the library loads), less its realpath, which
    would turn the private copy's name into its memfd's, which names no file."""
    ctypes.CDLL(path)
    torch.ops.loaded_libraries.add(path)


def _unavailable(why: str) -> None:
    _state.update(phase="unavailable", why=why)


def _torch_dir() -> Path:
    return Path(torch.__file__).resolve().parent


def _command(output: Path) -> list[str]:
    root = _torch_dir()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [*cxx.compiler(), *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{root / 'include'}",
            f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}", str(SOURCE), "-o", str(output),
            f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{root / 'lib'}"]


def _compile(output: Path) -> None:
    command = _command(output)
    compiler = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if compiler.returncode:
        raise RuntimeError(f"{' '.join(command[:2])} ... exited with {compiler.returncode}: "
                           f"{compiler.stderr.strip()[-2000:]}")


def _key() -> str:
    """Everything that changes the library: its source, torch's build, the compiler and the flags."""
    command = tuple(cxx.compiler())
    text = "\n".join([SOURCE.read_text(), torch.__version__, str(torch.version.git_version), str(_torch_dir()),
                      *command, cxx.compiler_version(command), *FLAGS])
    return "native-" + hashlib.sha256(text.encode()).hexdigest()[:40]


_LOCK_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # a link in the lock's place is refused


@contextlib.contextmanager
def _build_lock(wait: bool) -> Iterator[str | None]:
    """Hold the build lock for the block (None is yielded; the holder's process id is written into the file); where
    another process holds it and `wait` is False, the lock is not taken and its holder is yielded instead
    ("process 1234"), at once."""
    path = cache.cache_dir() / LOCK_NAME
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | _LOCK_FLAGS, 0o600), "r+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield _holder(handle)
            return
        try:
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
            yield None
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _holder(handle: Any) -> str:
    """The process holding the lock of `handle`'s file, by the id it wrote there ("another process" before it did)."""
    handle.seek(0)
    text = handle.read().strip()
    return f"process {text}" if text.isdigit() else "another process"


def _building_now(folder: Path) -> str | None:
    """The process building the library into `folder` now, or None; a look that neither takes the lock for longer
    than the look, nor creates the lock file, nor waits."""
    try:
        descriptor = os.open(folder / LOCK_NAME, os.O_RDONLY | _LOCK_FLAGS)
    except OSError:  # no lock file: no build ever started here
        return None
    with os.fdopen(descriptor) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


# -- where the library stands (`autocuda native`, `autocuda cache`) ----------------------------------------------
@dataclasses.dataclass(frozen=True)
class LibraryState:
    """Where the native library for this torch and compiler stands: `state` is "loaded" (in this process),
    "built" (in the cache), "building" (by another process now), "not built" or "unavailable"; `path` where it
    is (or would be stored); `why` what that means for calls."""

    state: str
    path: Path | None = None
    why: str = ""

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path is not None else ""
        return f"{self.state}{where}{': ' + self.why if self.why else ''}"


def library_state() -> LibraryState:
    """Where the library stands, found without building, loading or waiting for it (and with no cache folder made
    where there is none)."""
    off = "" if USE else f"; the native path is off in this process ({VARIABLE}=0)"
    if _CALL is not None:
        return LibraryState("loaded", Path(_state["path"]), f"CUDA calls take the native path{off}")
    if _state["phase"] == "unavailable":
        return LibraryState("unavailable", None, _state["why"])
    missing = cxx.missing_compiler()
    if missing is not None:
        return LibraryState("unavailable", None, f"{missing}; calls take the Python path")
    key, folder = _key(), store.root() / "host"
    found = cache.find(key) if folder.is_dir() else None
    if found is not None:
        return LibraryState("built", found, f"a process's first CUDA call loads it{off}")
    builder = _building_now(folder)
    if builder is not None:
        return LibraryState("building", None, f"{builder} is building it; processes started after it ends load it")
    return LibraryState("not built", folder / f"{key}.so",
                        "a process's first CUDA call builds it in the background (its calls take the Python path "
                        f"meanwhile); `autocuda native build` builds it now{off}")
