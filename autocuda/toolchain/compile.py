"""Compiling CUDA source: NVRTC (`toolchain.nvrtc`) on a GPU machine, nvcc as a compile check without one.

Loaded kernels are kept in memory per (device, source); binaries are kept in `autocuda.toolchain.store`'s `binaries`
folder, named by a digest of the source, the options and the architecture (atomically written, checked
against their checksum, rebuilt when damaged or when the driver refuses them).
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Collection, Iterable
from pathlib import Path

import torch

from ..base.errors import CompileError, DriverError
from . import nvrtc, store
from .driver import load_function

# Single-precision division without IEEE rounding (at most 2 ulp): the IEEE path branches to a slow path, and a
# branch in the time loop keeps the compiler from issuing later steps' loads early (float64 is unaffected).
# Denormals flushed to zero. No multiply-add contraction: which products the compiler fuses depends on the code
# around them (the unroll factor, neurons per thread), and every layout the tuner may pick must give bitwise
# the same results.
NVRTC_OPTIONS = ("-std=c++17", "--prec-div=false", "-ftz=true", "--fmad=false")
CHECK_ARCHS = ("sm_80", "sm_90")


def _numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))


# How this process obtained its kernels: "compiled" (NVRTC ran) or "disk" (the binary came from the disk cache).
# A process with a warm cache compiles nothing.
stats: Counter[str] = Counter()


@functools.cache
def kernel_function(source: str, name: str, device_index: int) -> int:
    """Kernel `name` of `source` loaded on a device (once per process and device), as a driver address. The
    binary comes from the disk cache when present there, else from NVRTC (and is then stored)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    entry = store.digest(repr((source, NVRTC_OPTIONS, f"sm_{major}{minor}")).encode())[:40]
    image = store.read("binaries", entry)
    if image is not None:
        try:
            function = load_function(image, name, device_index)
            stats["disk"] += 1
            return function
        except DriverError:  # a binary this driver cannot load (e.g. after a driver downgrade): rebuild it
            pass
    image = nvrtc_compile(source, name, device_index)
    function = load_function(image, name, device_index)
    store.save("binaries", entry, image)
    stats["compiled"] += 1
    return function


def nvrtc_compile(source: str, name: str, device_index: int) -> bytes:
    """A cubin of `source` for a device (PTX when NVRTC is older than the device)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    try:
        return nvrtc.compile_program(source, name, 10 * major + minor, NVRTC_OPTIONS)
    except nvrtc.NvrtcError as error:
        raise CompileError(f"NVRTC rejected kernel {name}: {error}\n{_numbered(source)}") from None


def nvcc_path() -> str:
    found = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    if found is None:
        raise RuntimeError("nvcc was not found: install the CUDA toolkit (or put nvcc on PATH) to compile-check")
    return found


# nvcc's fastest compile that still runs cicc (CUDA C++ to PTX) and ptxas (PTX to SASS) for each architecture:
# fast-compile from CUDA 12.8 on, both optimisers at -O0 before.
FAST_COMPILE, FAST_COMPILE_SINCE = ("--Ofast-compile=max",), (12, 8)
UNOPTIMISED = ("-Xcicc", "-O0", "-Xptxas", "-O0")


@functools.cache
def unoptimised_flags(nvcc: str) -> tuple[str, ...]:
    """The flags for an unoptimised check with this nvcc (by its release number)."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", version)
    release = (int(found[1]), int(found[2])) if found else (0, 0)
    return FAST_COMPILE if release >= FAST_COMPILE_SINCE else UNOPTIMISED


def nvcc_check(source: str, archs: Iterable[str] = CHECK_ARCHS, optimise: bool = True,
               assemble: bool | Collection[str] = True) -> None:
    """Compile `source` for each architecture with nvcc (no GPU needed); raise CompileError on failure.

    `optimise=False` compiles as fast as nvcc can (most of cicc's and ptxas's optimisations off). The verdict (does
    nvcc accept this source for these architectures?) is the same: whether a source is valid does not depend on how
    well it is optimised, and every stage that can refuse it (parsing, PTX generation, assembly into SASS) still
    runs. Leave it on where the output itself matters (register counts, spills, SASS).

    `assemble=False` stops at PTX for each architecture (the front end and cicc run, ptxas does not: about half the
    time): for checks of what the front end alone decides, such as the names a source declares (PTX names kernel
    parameters by position and values by register, so no name of the source's but the kernels' reaches ptxas).
    `assemble` may also name the architectures assembled to SASS, the others stopping at PTX."""
    archs = tuple(archs)
    assembled = set(archs if assemble is True else () if assemble is False else assemble)
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a if a in assembled else f'compute_{a[3:]}'}" for a in archs]
    nvcc = nvcc_path()
    flags = () if optimise else unoptimised_flags(nvcc)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix="autocuda-check-") as tmp:
        path = Path(tmp) / f"k{digest}.cu"
        path.write_text(source)
        result = subprocess.run([nvcc, "-std=c++17", "--fatbin", *flags, *gencode, "-o", os.devnull,
                                 str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"nvcc failed:\n{result.stderr.strip()}\n{_numbered(source)}")
