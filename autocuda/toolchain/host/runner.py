"""Run emitted CUDA source on the CPU: shim + kernel + a generated wrapper, compiled by the system C++
compiler into a shared library, loaded with ctypes, cached in memory and on disk.

The wrapper runs every block and thread one after another, so only kernels whose threads are independent
(every element-wise and per-neuron temporal kernel we emit) give the GPU's results.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...base.errors import KernelArgumentError
from .. import store
from ..cnames import KERNEL_NAME
from ..code import Code, braced
from . import cache, cxx


class KernelParam(Protocol):
    """What the runner reads of one kernel parameter (`autocuda.ckernel.CParam` is one; the runner sits below
    the code generator, so it names the reads, not the class)."""

    @property
    def name(self) -> str: ...

    @property
    def ctype(self) -> str: ...

    @property
    def pointer(self) -> bool: ...

    def declaration(self, restrict: bool = False, cname: str = "") -> str: ...


SHIM = Path(__file__).with_name("shim.h").read_text()
# The shim for a kernel with no half or bfloat16 value: without CUDA's half-precision headers (`shim_for`)
SHIM_PLAIN = "#define AUTOCUDA_HOST_NO_HALF\n" + SHIM
# Text that may name a half-precision type or header: a source holding none takes SHIM_PLAIN (any of them, even in a
# comment, takes the whole shim: slower, never wrong)
_HALF_WORDS = ("half", "bfloat16", "cuda_fp16", "cuda_bf16")
MAX_THREADS_PER_BLOCK = 1024  # the GPU's limit: a launch the GPU would refuse is refused here too

# How compiled kernels were obtained in this process: "memory", "disk" (cache hit) or "compiled".
stats: Counter[str] = Counter()

# Every name the wrapper declares starts with ac_host_ (the arguments are ac_host_arg0, 1, ..., whatever the
# kernel calls its parameters), so no name of the kernel's can shadow one.
_LAUNCH_PARAMS = ("unsigned ac_host_gx, unsigned ac_host_gy, unsigned ac_host_gz,\n"
                  "        unsigned ac_host_bx, unsigned ac_host_by, unsigned ac_host_bz, void** ac_host_args")


def shim_for(source: str) -> str:
    """The shim a kernel's unit starts with: SHIM_PLAIN where its source names no half-precision type or header,
    else SHIM."""
    return SHIM if any(word in source for word in _HALF_WORDS) else SHIM_PLAIN


def shim_of(unit: str) -> str | None:
    """The shim `unit` starts with (SHIM or SHIM_PLAIN), or None."""
    return next((shim for shim in (SHIM, SHIM_PLAIN) if unit.startswith(shim)), None)


def translation_unit(source: str, name: str, params: Sequence[KernelParam]) -> str:
    """The C++ text compiled for one kernel: the shim, the kernel, and a wrapper that unpacks each parameter by
    its declaration, under a name of its own, and runs every thread in turn. #line makes compiler messages cite
    lines of the kernel source as numbered in CompileError. The wrapper calls the kernel through a volatile pointer
    (typed by the arguments, so it picks the kernel as the call would): the compiler does not inline a second copy
    of the kernel into the loop, which would double the time it spends on it."""
    args = [f"ac_host_arg{i}" for i in range(len(params))]
    sizes = "".join(f"sizeof({'void*' if p.pointer else p.ctype}), " for p in params)
    code = Code()
    code.line(shim_for(source))
    code.line(f'#line 1 "{name}.cu"')
    code.line(source)
    code.line(f'#line 1 "{name}__host_wrapper.cpp"')
    code.line(f'extern "C" AC_HOST_EXPORT const unsigned {name}__host_arg_sizes[] = {braced(sizes + "0u")};')
    code.blank()
    with code.block(f'extern "C" AC_HOST_EXPORT void {name}__host_launch({_LAUNCH_PARAMS})'):
        for i, (param, arg) in enumerate(zip(params, args)):
            code.line(f"{param.declaration(cname=arg)} = ac_host_slot{braced(f'ac_host_args[{i}]')};")
        code.line(f"void (*volatile ac_host_kernel)({', '.join(f'decltype({arg})' for arg in args)}) = {name};")
        code.line(f"gridDim = uint3{braced('ac_host_gx, ac_host_gy, ac_host_gz')};")
        code.line(f"blockDim = uint3{braced('ac_host_bx, ac_host_by, ac_host_bz')};")
        for dim in ("z", "y", "x"):
            code.line(f"for (blockIdx.{dim} = 0; blockIdx.{dim} < ac_host_g{dim}; ++blockIdx.{dim})")
        for dim in ("z", "y", "x"):
            code.line(f"for (threadIdx.{dim} = 0; threadIdx.{dim} < ac_host_b{dim}; ++threadIdx.{dim})")
        code.depth += 1
        code.line(f"ac_host_kernel({', '.join(args)});")
        code.depth -= 1
    return code.text + "\n"


@dataclass(frozen=True)
class HostKernel:
    """A loaded host library: the launcher and the byte size of each argument it reads."""

    library: ctypes.CDLL
    function: Any
    arg_sizes: tuple[int, ...]
    path: Path


_loaded: dict[tuple[str, str, tuple], HostKernel] = {}
# One lock per kernel being loaded: threads that ask for the same kernel at once (check_spec runs its cases in
# threads) wait for one compile instead of each compiling it.
_loading: dict[tuple[str, str, tuple], threading.Lock] = {}
_loading_guard = threading.Lock()
Job = tuple[str, str, "Sequence[KernelParam]"]  # (source, kernel name, parameters), as load_kernel takes them
# Kernels per compiler run in `load_kernels`: each run pays the compiler's start-up, the precompiled shim's load and
# the link once, for the whole group.
GROUP = 32


def load_kernel(source: str, name: str, params: Sequence[KernelParam]) -> HostKernel:
    """Kernel `name` of `source` compiled for the host (memory cache, then disk cache, then the compiler)."""
    _check_name(name)
    key = (source, name, tuple(params))
    if key in _loaded:
        stats["memory"] += 1
        return _loaded[key]
    with _loading_guard:
        lock = _loading.setdefault(key, threading.Lock())
    try:
        with lock:
            if key in _loaded:  # another thread loaded it while this one waited
                stats["memory"] += 1
                return _loaded[key]
            unit = translation_unit(source, name, params)
            path, data, cached = cache.obtain(_digest(unit), lambda out: _compile(unit, source, name, out))
            stats["disk" if cached else "compiled"] += 1
            _loaded[key] = _open(path, data, name, params)
            return _loaded[key]
    finally:
        with _loading_guard:
            _loading.pop(key, None)


def load_kernels(jobs: Iterable[Job], group: int = GROUP, workers: int | None = None) -> list[HostKernel]:
    """Several kernels, each as `load_kernel` gives it (kernel names distinct). Those in neither cache are
    compiled `group` to a compiler run, `workers` runs at a time (default: one per core): one library holding
    the group, stored under each kernel's own key, so a later `load_kernel` finds it. A group the compiler
    refuses is compiled kernel by kernel, so each kernel then compiles, or fails naming itself, on its own (the
    first such error is raised once the others are compiled). Each source must stand alone, as for load_kernel
    (generated kernels do: their shared preludes sit behind include guards): in a group, one that uses a name
    only another kernel's text defines would compile."""
    keyed = [(source, name, tuple(params)) for source, name, params in jobs]
    for _, name, _ in keyed:
        _check_name(name)
    if len({name for _, name, _ in keyed}) < len(keyed):
        raise ValueError("load_kernels: two kernels share a name (a group becomes one library)")
    missing = [job for job in keyed if job not in _loaded and not _from_disk(job)]
    groups = [missing[i:i + max(1, group)] for i in range(0, len(missing), max(1, group))]
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        list(pool.map(_compile_group, groups))
    return [_loaded[job] for job in keyed]


def _digest(unit: str) -> str:
    return hashlib.sha256(f"{cxx.identity()}\n{unit}".encode()).hexdigest()


def _open(path: Path, data: bytes, name: str, params: Sequence[KernelParam]) -> HostKernel:
    """The kernel of library `data` (verified from the cache at `path`, or just built): loaded from those bytes,
    never from `path` again (`cache.open_library`)."""
    library = cache.open_library(data, ctypes.CDLL)
    function = getattr(library, f"{name}__host_launch")
    function.argtypes = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]
    function.restype = None
    sizes = (ctypes.c_uint * len(params)).in_dll(library, f"{name}__host_arg_sizes")
    return HostKernel(library, function, tuple(sizes), path)


def _from_disk(job: tuple[str, str, tuple]) -> bool:
    """Whether the job's library is in the disk cache (then loaded into memory, counted as "disk")."""
    source, name, params = job
    found = cache.cached(_digest(translation_unit(source, name, params)))
    if found is None:
        return False
    _loaded[job] = _open(*found, name, params)
    stats["disk"] += 1
    return True


def _compile_group(jobs: list[tuple[str, str, tuple]]) -> None:
    """Compile the jobs as one library (each kernel's translation unit after one shim) into the cache, and load
    each from it; kernel by kernel when the compiler refuses the group."""
    from ...base.errors import CompileError

    units = [translation_unit(*job) for job in jobs]
    if len(jobs) > 1:
        shims = [shim_of(u) or "" for u in units]
        unit = (SHIM if SHIM in shims else SHIM_PLAIN) + "".join(u[len(shim):] for u, shim in zip(units, shims))
        try:
            paths, data = cache.build_shared([_digest(u) for u in units],
                                             lambda out: _compile(unit, unit, "group", out))
        except CompileError:
            pass
        else:
            for job, path in zip(jobs, paths):
                _loaded[job] = _open(path, data, job[1], job[2])
            stats["compiled"] += len(jobs)
            return
    refused = []
    for job in jobs:
        try:
            load_kernel(*job)
        except CompileError as error:
            refused.append(error)
    if refused:
        raise refused[0]


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not KERNEL_NAME.match(name):
        raise ValueError(f"kernel name {name!r:.80}: expected a C identifier ({KERNEL_NAME.pattern})")


def _shim_header(shim: str = SHIM) -> Path | None:
    """The shim as a header beside its precompiled form (`shim.h.gch`): the precompiled form is built once per
    toolchain into the host cache, and each process copies the verified bytes into its private folder, where the
    compiler reads both (the compiler never reads the cache by name). A unit that includes it does not parse the
    CUDA half-precision headers again; a compiler that does not read `.gch` files parses the header, as it would
    the shim inline. None where none could be built, written or copied (the shim folder refused, the disk full):
    units then carry the shim."""
    digest = hashlib.sha256(f"{cxx.identity()}\n{shim}".encode()).hexdigest()
    folder = cache.cache_dir() / f"shim-{digest[:16]}"
    with _loading_guard:
        lock = _header_locks.setdefault(folder, threading.Lock())
    with lock:  # threads that compile at once (load_kernels' groups) wait for one header, not each build it
        return _shim_header_in(folder, shim)


def _shim_header_in(folder: Path, shim: str) -> Path | None:
    """`_shim_header` for the cache's shim folder `folder` (the caller holds its lock)."""
    copy = _private_headers.get(folder)
    if copy is not None and copy.is_file() and copy.with_name(PRECOMPILED).is_file():
        return copy
    if folder in _unavailable_headers:
        return None
    try:
        store.private_folder(folder)  # a link or another user's folder in its place is refused, never read
        precompiled = _verified_precompiled(folder, shim) or _precompile(folder, shim)
        copy = None if precompiled is None else cache.private_copies({"shim.h": shim.encode(),
                                                                      PRECOMPILED: precompiled}) / "shim.h"
    except OSError:
        copy = None
    if copy is None or '"' in str(copy) or "\\" in str(copy):  # not writable in an #include
        _unavailable_headers.add(folder)
        return None
    _private_headers[folder] = copy
    return copy


def _verified_precompiled(folder: Path, shim: str) -> bytes | None:
    """The precompiled shim's bytes in the cache's shim folder, verified with its header (a damaged .gch would
    stop g++), or None."""
    header, precompiled = folder / "shim.h", folder / PRECOMPILED
    try:
        if store.verified_bytes(header) == shim.encode():
            return store.verified_bytes(precompiled)
    except OSError:
        pass
    return None


def _precompile(folder: Path, shim: str) -> bytes | None:
    """The precompiled shim, built and stored into the cache's shim folder; None when the compiler refuses
    (OSError when it cannot be written)."""
    with tempfile.TemporaryDirectory(prefix="autocuda-pch-") as tmp:
        source, built = Path(tmp) / "shim.h", Path(tmp) / PRECOMPILED
        source.write_text(shim)
        if subprocess.run(cxx.precompile_command(source, built), capture_output=True).returncode != 0:
            return None
        data = built.read_bytes()
    store.write(folder / "shim.h", shim.encode())
    store.write(folder / PRECOMPILED, data)
    return data


PRECOMPILED = "shim.h.gch"
_private_headers: dict[Path, Path] = {}  # a shim folder of the cache -> the verified header's private copy
_unavailable_headers: set[Path] = set()  # shim folders refused or unwritable in this process: units carry the shim
_header_locks: dict[Path, threading.Lock] = {}  # a shim folder of the cache -> the lock of its header's making


def _forget_locks() -> None:
    """In a forked child: the threads that held the parent's locks (a kernel or a shim header being made) do not
    exist there, so a lock held at the fork would never be released; the child starts with none held, and makes
    what it needs itself."""
    global _loading_guard
    _loading.clear()
    _header_locks.clear()
    _loading_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks)


def _compile(unit: str, source: str, name: str, output: Path) -> None:
    from ...base.errors import CompileError

    shim = shim_of(unit)
    header = _shim_header(shim) if shim is not None else None
    text = f'#include "{header}"{unit[len(shim or ""):]}' if header is not None else unit
    with tempfile.TemporaryDirectory(prefix="autocuda-host-") as folder:
        path = Path(folder) / f"{name}.cpp"
        path.write_text(text)
        command = cxx.compile_command(path, output)
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        numbered = "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))
        raise CompileError(f"the host compiler rejected kernel {name} ({' '.join(command)}):\n"
                           f"{result.stderr.strip()}\n--- {name}.cu ---\n{numbered}")


def launch_dims(shape: Sequence[int], what: str) -> tuple[int, int, int]:
    """A grid or a block (`what`) as (x, y, z): 1 to 3 sizes, each an int or a NumPy integer (a float or a text
    is refused, never truncated), from 1 to 2**31 - 1."""
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in shape):
        raise KernelArgumentError(f"{what}: expected a tuple of 1 to 3 integers, got {shape!r:.80}")
    dims = tuple(int(d) for d in shape)
    if not 1 <= len(dims) <= 3 or any(d < 1 or d >= 2**31 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive integers, got {tuple(shape)}")
    x, y, z = (dims + (1, 1))[:3]
    return x, y, z


def launch(source: str, name: str, params: Sequence[KernelParam], grid: Sequence[int], block: Sequence[int],
           args: Sequence[np.generic], device: Any = None) -> None:
    """Run kernel `name` of `source` on the CPU over `grid` x `block` threads, one after another.

    `args` are packed like the GPU launch's (pointers as np.uint64 addresses of CPU memory, scalars as
    NumPy scalars of the declared width); `device` (torch.device('cpu')) is accepted for the common
    backend signature.
    """
    gx, gy, gz = launch_dims(grid, "grid")
    bx, by, bz = launch_dims(block, "block")
    if bx * by * bz > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"block {tuple(block)} has more than {MAX_THREADS_PER_BLOCK} threads")
    if len(args) != len(params):
        raise TypeError(f"kernel {name}: {len(args)} arguments for {len(params)} parameters")
    if device is not None and getattr(device, "type", device) != "cpu":
        raise ValueError(f"kernel {name}: the host runner runs on CPU tensors, got device {device}")
    kernel = load_kernel(source, name, params)
    holders = [np.asarray(a) for a in args]  # owns each value's bytes until the call returns
    for param, held, size in zip(params, holders, kernel.arg_sizes, strict=True):
        if held.nbytes != size:
            from ...base.errors import KernelArgumentError
            raise KernelArgumentError(f"kernel {name}: argument {param.name} ({param.ctype}) packed in "
                                      f"{held.nbytes} bytes, the kernel reads {size}")
    pointers = (ctypes.c_void_p * max(1, len(holders)))(*(h.ctypes.data for h in holders))
    kernel.function(gx, gy, gz, bx, by, bz, pointers)
