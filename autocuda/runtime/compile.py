"""Compiling CUDA source: NVRTC through CuPy on a GPU machine, nvcc as a compile check without one.

Compiled modules are kept in memory per (device, source, options); CuPy keeps the binaries in its own
hashed, atomically written disk cache (see `configure_disk_cache`): its key covers the source, the options,
the architecture and the NVRTC version, and an entry whose checksum does not match is rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# Single-precision division without IEEE rounding (at most 2 ulp): the IEEE path branches to a slow path, and a
# branch in the time loop keeps the compiler from issuing later steps' loads early. In the same-day H200 runs
# (`bench/results/2026-11-22-h200-long-unrolled` against `-ieee-division`) LIF float32 training at
# (T, N) = (1024, 16K) took 0.42 ms with it and 0.82 ms without; float64 is unaffected.
NVRTC_OPTIONS = ("-std=c++17", "--prec-div=false")
CHECK_ARCHS = ("sm_80", "sm_90")


class CompileError(RuntimeError):
    """The CUDA compiler refused generated source; the message holds its diagnostics and the source."""


def _numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def import_cupy():
    """CuPy, or an error that says how to install it (other import failures are not disguised)."""
    try:
        import cupy
    except ModuleNotFoundError as error:
        if error.name != "cupy":
            raise
        raise RuntimeError("running CUDA kernels needs CuPy: pip install 'autocuda[cuda12]' or "
                           "'autocuda[cuda13]' (matching your CUDA driver)") from error
    return cupy


# How this process obtained its kernels: "compiled" (NVRTC ran: a new entry in CuPy's disk cache, or no disk
# cache) or "disk" (CuPy loaded the binary from its disk cache). A process with a warm cache compiles nothing.
stats: Counter[str] = Counter()


def cache_dir() -> Path | None:
    """CuPy's kernel cache directory (CUPY_CACHE_DIR, or its default), None when it caches in memory only."""
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "") == "1":
        return None
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


@functools.cache
def configure_disk_cache() -> None:
    """Point CuPy's kernel cache at AUTOCUDA_CACHE_DIR/cupy when that is set (CUPY_CACHE_DIR, if set, wins);
    an unwritable cache directory degrades to CuPy's in-memory cache, with one warning."""
    path = os.environ.get("AUTOCUDA_CACHE_DIR")
    if path:
        os.environ.setdefault("CUPY_CACHE_DIR", str(Path(path) / "cupy"))
    directory = cache_dir()
    if directory is not None and not _writable(directory):
        warnings.warn(f"autocuda: kernel cache directory {directory} is not writable; compiled kernels are "
                      "cached in memory only (set AUTOCUDA_CACHE_DIR to a writable directory)", RuntimeWarning,
                      stacklevel=2)
        os.environ["CUPY_CACHE_IN_MEMORY"] = "1"


def _entries() -> set[str]:
    directory = cache_dir()
    try:
        return set(os.listdir(directory)) if directory is not None else set()
    except OSError:
        return set()


@functools.cache
def cupy_function(source: str, name: str, device_index: int):
    """The compiled kernel `name` of `source` on one device (compiled once per process and device)."""
    configure_disk_cache()
    cupy = import_cupy()
    before = _entries()
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source, options=NVRTC_OPTIONS)
        try:
            function = module.get_function(name)
        except cupy.cuda.compiler.CompileException as error:
            raise CompileError(f"NVRTC rejected kernel {name}:\n{error}\n{_numbered(source)}") from None
    stats["compiled" if cache_dir() is None or _entries() - before else "disk"] += 1
    return function


def nvcc_path() -> str:
    found = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    if found is None:
        raise RuntimeError("nvcc was not found: install the CUDA toolkit (or put nvcc on PATH) to compile-check")
    return found


def nvcc_check(source: str, archs: Iterable[str] = CHECK_ARCHS) -> None:
    """Compile `source` for each architecture with nvcc (no GPU needed); raise CompileError on failure."""
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix="autocuda-check-") as tmp:
        path = Path(tmp) / f"k{digest}.cu"
        path.write_text(source)
        result = subprocess.run([nvcc_path(), "-std=c++17", "--fatbin", *gencode, "-o", os.devnull, str(path)],
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"nvcc failed:\n{result.stderr.strip()}\n{_numbered(source)}")
