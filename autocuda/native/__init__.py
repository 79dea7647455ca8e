"""The native call path: prepared neuron calls (`autocuda.prepared`) run through one C++ operator,
`autocuda_native::call`, whose autograd node is C++ as well (`neuron_call.cpp`). A small call then runs no Python
between torch and its kernel launches, in the forward or in the backward.

The library is built from `neuron_call.cpp` against the installed torch with the host's C++ compiler, once per
torch build and compiler, and kept in the disk cache's `host` folder (checksummed, private: `autocuda.store`); it is
loaded from the bytes verified there, never opened again by its name (`autocuda.host.cache.open_verified`).
The path is for CUDA calls: it is on for them unless `AUTOCUDA_NATIVE=0` (or `autocuda.native.USE = False`).
Calls on CPU tensors take it only where `AUTOCUDA_NATIVE` is 1 or on (`autocuda.native.HOST`): there it runs the
host runner's kernels, as the Python path does, and a machine without CUDA would build the library for nothing.
A process asks for the library on its first prepared call that takes the path: it is loaded from the cache, or
built by a helper process (`python -m autocuda.native`) while calls take the Python path; the helper finishes the
build where the process ends first, so that the next one finds it. `ensure()` builds and loads it now. Without a
compiler every call takes the Python path; `status()` says why.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..host import cache, toolchain

SOURCE = Path(__file__).with_name("neuron_call.cpp")
VARIABLE = "AUTOCUDA_NATIVE"
_SWITCH = {"0": False, "off": False, "1": True, "on": True, "": True}
FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wno-c++20-extensions")

_lock = threading.Lock()
_state = {"phase": "unasked", "why": ""}  # unasked -> building -> loaded | unavailable
_builder: list[threading.Thread] = []
_CALL = None  # the loaded `call` operator's C++ callable
_OPERATORS: dict[str, Any] = {}  # every loaded operator's C++ callable by name (see `operator`)


def enabled() -> bool:
    """Whether $AUTOCUDA_NATIVE asks prepared calls to use the native path (unset, 1 or on: yes; 0 or off: no)."""
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


USE = _use_from_environment()  # whether prepared CUDA calls take the native path (tests and benchmarks set it)
HOST = USE and on_host()  # whether prepared host calls take it too


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
    """Load the operator now, waiting for its build where it is not in the cache (True once loaded)."""
    loaded()
    for thread in list(_builder):
        thread.join()
    return _CALL is not None


def status() -> str:
    """One line: whether the native path is in use, and if not, why."""
    if _CALL is not None:
        return "loaded"
    return f"{_state['phase']}{': ' + _state['why'] if _state['why'] else ''}"


def call(plan: int, x: torch.Tensor, numbers: Sequence[float]) -> list[torch.Tensor]:
    """The plan's forward outputs (an autograd node recorded where the plan trains)."""
    return _CALL(plan, x, numbers)  # type: ignore[misc]


def operator(name: str = "call") -> Callable[[int, torch.Tensor, Sequence[float]], list[torch.Tensor]]:
    """An operator's C++ callable, once loaded (held by who calls it often: no Python frame in between): `call`,
    or `layer_call`, a layer's repeated call, which gives the spikes in x's shape and the final states in its
    neuron shape, or an empty list for an x the plan was not made for."""
    if name not in _OPERATORS:
        raise RuntimeError(f"the native operator is not loaded ({status()})")
    return _OPERATORS[name]


def make_plan(words: list[int], dtypes: list[torch.dtype]) -> int:
    return torch.ops.autocuda_native.make_plan(words, dtypes)


def _start() -> None:
    missing = toolchain.missing_compiler()
    if missing is not None:
        return _unavailable(missing)
    key = _key()
    found = cache.find(key)
    if found is not None:
        return _load(found)
    try:  # started here, not in the thread: a process that ends at once still leaves its build running
        helper = subprocess.Popen([sys.executable, "-m", __name__], cwd=Path(__file__).parents[2],
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
        found = cache.find(key)
        if found is None:
            raise RuntimeError(errors.strip()[-2000:] or f"the build exited with {helper.returncode} and stored no "
                               f"library in {cache.cache_dir()}")
        _load(found)
    except Exception as error:  # any failure leaves the Python path in place, said once
        _unavailable(f"building {SOURCE.name} failed: {error}")
        warnings.warn(f"autocuda: the native call path is unavailable ({error}); calls take the Python path",
                      RuntimeWarning, stacklevel=1)


def build_into_cache() -> int:
    """Build the library into the host cache unless it is there (what the helper process runs): 0 once it is
    there, else 1 with the reason on stderr. One process builds at a time; the others then find its library."""
    key = _key()
    try:
        with _build_lock():
            cache.load_or_build(key, _compile)
    except Exception as error:
        print(f"autocuda: building {SOURCE.name} failed: {error}", file=sys.stderr)
        return 1
    return 0


def _load(path: Path) -> None:
    global _CALL
    try:
        cache.open_verified(path, _open_library)  # the bytes verified, never `path` opened again
        for name in ("layer_call", "call"):  # each overload's __call__ only forwards to its C++ callable
            overload = getattr(torch.ops.autocuda_native, name).default
            _OPERATORS[name] = getattr(overload, "_op", overload)
        _CALL = _OPERATORS["call"]
        _state.update(phase="loaded", why="")
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
    return [*toolchain.compiler(), *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{root / 'include'}",
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
    command = tuple(toolchain.compiler())
    text = "\n".join([SOURCE.read_text(), torch.__version__, str(torch.version.git_version), str(_torch_dir()),
                      *command, toolchain.compiler_version(command), *FLAGS])
    return "native-" + hashlib.sha256(text.encode()).hexdigest()[:40]


@contextlib.contextmanager
def _build_lock():
    path = cache.cache_dir() / ".native-build.lock"  # hidden: no cache entry; a link in its place is not followed
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags, 0o600), "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
