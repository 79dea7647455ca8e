"""NVRTC, the CUDA runtime compiler, through ctypes.

Compiling needs neither CuPy nor NumPy (importing either is a large share of a cold first use). The library
comes with PyTorch's CUDA wheels (nvidia-cuda-nvrtc, which torch loads itself) or with a CUDA toolkit; the
half-precision headers (cuda_fp16.h, cuda_bf16.h) come with the CUDA runtime wheel or the toolkit.
ctypes releases the GIL while NVRTC compiles, so threads can compile in parallel.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from collections.abc import Iterator, Sequence

from ..base.errors import NvrtcError

_SUCCESS = 0
_HEADER = "cuda_fp16.h"


def _toolkit_roots() -> Iterator[str]:
    for variable in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"):
        if os.environ.get(variable):
            yield os.environ[variable]
    yield "/usr/local/cuda"


def _wheel_roots() -> Iterator[str]:
    """nvidia/<package>/ folders of the pip wheels on sys.path (cu13 wheels share nvidia/cu13/)."""
    for entry in sys.path:
        yield from sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*")))


def _library_candidates() -> Iterator[str]:
    # A soname first: torch has usually loaded its own NVRTC already, and the loader then returns that one.
    import torch

    majors = [torch.version.cuda.split(".")[0]] if torch.version.cuda else []
    for major in dict.fromkeys([*majors, "13", "12"]):
        yield f"libnvrtc.so.{major}"
    yield "libnvrtc.so"
    for root in [*_wheel_roots(), *_toolkit_roots()]:
        for folder in ("lib", "lib64"):
            yield from sorted(glob.glob(os.path.join(root, folder, "libnvrtc.so*")), reverse=True)


@functools.cache
def _library() -> ctypes.CDLL | None:
    for candidate in _library_candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        if hasattr(lib, "nvrtcCompileProgram"):
            return _declare(lib)
    return None


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    pointer, size = ctypes.c_void_p, ctypes.c_size_t
    strings = ctypes.POINTER(ctypes.c_char_p)
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(pointer), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       strings, strings]
    lib.nvrtcCompileProgram.argtypes = [pointer, ctypes.c_int, strings]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(pointer)]
    for getter in ("ProgramLog", "CUBIN", "PTX"):
        getattr(lib, f"nvrtcGet{getter}Size").argtypes = [pointer, ctypes.POINTER(size)]
        getattr(lib, f"nvrtcGet{getter}").argtypes = [pointer, ctypes.c_char_p]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetNumSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcGetSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def found() -> bool:
    """Whether NVRTC can be loaded in this process."""
    return _library() is not None


def library() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("compiling CUDA kernels needs NVRTC (libnvrtc.so), which comes with PyTorch's CUDA wheels "
                         "and with the CUDA toolkit; none was found on the loader's path, in nvidia/*/lib of "
                         "sys.path, or under CUDA_PATH, CUDA_HOME or /usr/local/cuda. Install it with pip install "
                         "'autocuda[cuda13]' (or [cuda12]), or set CUDA_PATH to a toolkit")
    return lib


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


def _loaded_path(lib: ctypes.CDLL) -> str:
    """The file a library loaded by soname came from (dladdr on one of its functions)."""
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.cast(lib.nvrtcCompileProgram, ctypes.c_void_p), ctypes.byref(info)):
        return ""
    return os.path.realpath((info.fname or b"").decode())


@functools.cache
def include_folders() -> tuple[str, ...]:
    """Folders holding the CUDA headers the generated source includes (NVRTC searches none by default):
    beside the NVRTC that was loaded (headers of its own release), else in the wheels and toolkits."""
    lib = _library()
    beside = os.path.join(os.path.dirname(os.path.dirname(_loaded_path(lib))), "include") if lib else ""
    roots = [os.path.join(root, "include") for root in [*_wheel_roots(), *_toolkit_roots()]]
    return tuple(f for f in dict.fromkeys([beside, *roots]) if f and os.path.isfile(os.path.join(f, _HEADER)))


def version() -> str:
    """NVRTC's release, e.g. '13.0'."""
    lib, major, minor = library(), ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return f"{major.value}.{minor.value}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities this NVRTC emits binaries for, as 10 * major + minor."""
    lib = library()
    count = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * count.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return tuple(archs)


def _check(lib: ctypes.CDLL, status: int, call: str, log: str = "") -> None:
    if status != _SUCCESS:
        reason = (lib.nvrtcGetErrorString(status) or b"?").decode()
        raise NvrtcError(f"{call} failed: {reason}" + (f"\n{log}" if log else ""))


def compile_program(source: str, name: str, arch: int, options: Sequence[str]) -> bytes:
    """A cubin of `source` for compute capability `arch` (10 * major + minor), or PTX for the newest
    architecture this NVRTC knows when it is older than the device (the driver then compiles the PTX)."""
    lib = library()
    cubin = arch in supported_archs()
    target = arch if cubin else max(a for a in supported_archs() if a <= arch)
    flags = [*options, f"--gpu-architecture={'sm' if cubin else 'compute'}_{target}",
             *(f"-I{folder}" for folder in include_folders())]
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None,
                                       None), "nvrtcCreateProgram")
    try:
        status = lib.nvrtcCompileProgram(program, len(flags), (ctypes.c_char_p * len(flags))(
            *(f.encode() for f in flags)))
        _check(lib, status, "nvrtcCompileProgram", _read(lib, program, "ProgramLog").decode(errors="replace"))
        return _read(lib, program, "CUBIN" if cubin else "PTX")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def _read(lib: ctypes.CDLL, program: ctypes.c_void_p, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib, f"nvrtcGet{what}Size")(program, ctypes.byref(size)), f"nvrtcGet{what}Size")
    buffer = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, f"nvrtcGet{what}")(program, buffer), f"nvrtcGet{what}")
    data = buffer.raw
    return data.rstrip(b"\0") if what != "CUBIN" else data
