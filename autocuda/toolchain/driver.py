"""The few CUDA driver calls that load and launch compiled kernels, through ctypes.

Loading a binary and launching it needs neither CuPy nor NumPy: a process whose kernels are all in the disk
cache starts without importing them. Kernels load into a device's primary context, the one torch's runtime
uses, and each launch runs in that context: a thread where only torch's runtime ran so far (autograd's
worker thread, a thread the user started) may have no current driver context at all.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

from ..base.errors import DriverError

_SUCCESS = 0


@functools.cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
    pointer, uint = ctypes.c_void_p, ctypes.c_uint
    lib.cuLaunchKernel.argtypes = [pointer, uint, uint, uint, uint, uint, uint, uint, pointer, pointer, pointer]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(pointer)]
    lib.cuCtxSetCurrent.argtypes = [pointer]
    lib.cuCtxPushCurrent_v2.argtypes = [pointer]
    lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(pointer)]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(pointer), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(pointer), pointer, ctypes.c_char_p]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(pointer), ctypes.c_int]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    _check(lib, lib.cuInit(0), "cuInit")
    return lib


# The driver functions a native launch calls (`autocuda.native`), in the order its plans list them
NATIVE_FUNCTIONS = ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent_v2",
                    "cuCtxPopCurrent_v2")


def function_addresses(names: tuple[str, ...]) -> tuple[int, ...]:
    """The addresses of driver functions, for native code that calls them."""
    lib = _library()
    return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0 for name in names)


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status != _SUCCESS:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        raise DriverError(f"{call} failed: {(name.value or b'?').decode()} ({status})")


@functools.cache
def primary_context(device_index: int) -> int:
    """The primary context of a device (torch's), as an address."""
    lib = _library()
    device, context = ctypes.c_int(), ctypes.c_void_p()
    _check(lib, lib.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    return _address(context, "cuDevicePrimaryCtxRetain")


def load_function(image: bytes, name: str, device_index: int) -> int:
    """Load a cubin (or PTX) image on a device and return kernel `name` in it, as an address."""
    lib = _library()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    with _in_context(lib, primary_context(device_index)):
        _check(lib, lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        _check(lib, lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
    return _address(function, "cuModuleGetFunction")


def _address(pointer: ctypes.c_void_p, call: str) -> int:
    """The address a successful driver call wrote (never NULL)."""
    if pointer.value is None:
        raise DriverError(f"{call} succeeded but returned a null handle")
    return pointer.value


class _in_context:
    """Make `context` current on this thread for a block, and restore whatever was current before."""

    def __init__(self, lib: ctypes.CDLL, context: int):
        self.lib, self.context, self.pushed = lib, context, False

    def __enter__(self) -> None:
        current = ctypes.c_void_p()
        self.lib.cuCtxGetCurrent(ctypes.byref(current))
        if current.value != self.context:
            _check(self.lib, self.lib.cuCtxPushCurrent_v2(self.context), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc: object) -> None:
        if self.pushed:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def _unprototyped(lib: ctypes.CDLL, name: str):
    """`name` of `lib` without argtypes: ctypes then converts no argument, so every call must pass ctypes
    objects where C wants pointers and plain ints only where C wants 32-bit integers."""
    function = lib._FuncPtr((name, lib))
    function.restype = ctypes.c_int
    return function


class Launcher:
    """Launches one loaded kernel with arguments written into preallocated 8-byte slots (see toolchain.launch).
    The driver copies the values during the launch call, so a lock around writing and launching suffices.

    The two driver calls of a launch go through unprototyped ctypes functions with their pointer arguments
    prepared once: ctypes' conversion through argtypes would cost each launch about twice the host time."""

    def __init__(self, function: int, device_index: int, slots: int):
        self.lib = _library()
        self.function, self.context = function, primary_context(device_index)
        self.slots = (ctypes.c_uint64 * max(1, slots))()
        base = ctypes.addressof(self.slots)
        self.pointers = (ctypes.c_void_p * max(1, slots))(*(base + 8 * i for i in range(max(1, slots))))
        self.lock = threading.Lock()
        self._current = ctypes.c_void_p()
        self._current_ref = ctypes.byref(self._current)
        self._function = ctypes.c_void_p(function)
        self._get_current = _unprototyped(self.lib, "cuCtxGetCurrent")
        self._launch = _unprototyped(self.lib, "cuLaunchKernel")

    def in_own_context(self) -> bool:
        """Whether this thread's current context is the kernel's (the caller holds `lock`)."""
        self._get_current(self._current_ref)
        return self._current.value == self.context

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], stream: int) -> None:
        """Launch with the slots as they are (the caller holds `lock` while writing them and launching)."""
        self._get_current(self._current_ref)
        current = self._current.value
        if current != self.context:
            if current is not None:  # another device's context: use this one for the launch, then restore it
                with _in_context(self.lib, self.context):
                    return self.launch(grid, block, stream)
            # No context on this thread yet (torch's autograd worker runs every backward on one): make the
            # device's primary context current, as cudaSetDevice would, rather than pushing and popping it on
            # every launch (two more driver calls each).
            _check(self.lib, self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        # Grid and block sizes and shared memory bytes are unsigned ints in C, passed as C ints: the same bits
        # for 0 <= size < 2**31, while ctypes would silently mask other values (CUDA's limits are lower: the
        # driver refuses sizes between). One OR of the six sizes shows whether any has a bit at 31 or above.
        gx, gy, gz = grid
        bx, by, bz = block
        if (gx | gy | gz | bx | by | bz) >> 31:
            raise DriverError(f"cuLaunchKernel: grid {grid} or block {block} outside the driver's limits")
        status = self._launch(self._function, gx, gy, gz, bx, by, bz, 0, ctypes.c_void_p(stream), self.pointers,
                              None)
        if status != _SUCCESS:
            _check(self.lib, status, "cuLaunchKernel")
        return None
