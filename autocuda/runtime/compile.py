"""Compiling CUDA source: NVRTC through CuPy on a GPU machine, nvcc as a compile check without one.

Compiled modules are kept in memory per (device, source, options); CuPy keeps the binaries in its own
hashed, atomically written disk cache (see `configure_disk_cache`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

NVRTC_OPTIONS = ("-std=c++17",)
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


def configure_disk_cache() -> None:
    """Point CuPy's kernel cache at AUTOCUDA_CACHE_DIR when that is set."""
    path = os.environ.get("AUTOCUDA_CACHE_DIR")
    if path:
        os.environ.setdefault("CUPY_CACHE_DIR", str(Path(path) / "cupy"))


@functools.cache
def cupy_function(source: str, name: str, device_index: int):
    """The compiled kernel `name` of `source` on one device (compiled once per process and device)."""
    configure_disk_cache()
    cupy = import_cupy()
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source, options=NVRTC_OPTIONS)
        try:
            return module.get_function(name)
        except cupy.cuda.compiler.CompileException as error:
            raise CompileError(f"NVRTC rejected kernel {name}:\n{error}\n{_numbered(source)}") from None


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
