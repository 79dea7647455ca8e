"""The host toolchain: a C++17 compiler and the CUDA headers (for cuda_fp16.h / cuda_bf16.h), and the
identity of both, which keys the disk cache."""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

# The host results must not depend on the optimisation level, so that the level can be chosen for compile time:
# -ffp-contract=off: no fused multiply-add (baseline aarch64 and -march=native x86 would otherwise fuse), so host
# results are the plain IEEE evaluation order, as torch's element-wise reference computes them; no -ffast-math
# (kernels keep NaN/Inf semantics, no reassociation); -fno-builtin: no library call is folded at compile time or
# replaced (a libm call whose argument an optimisation made constant would otherwise be evaluated by the compiler,
# correctly rounded, where glibc's is not). With these every level computes the same values, so the level is the
# one that compiles fastest: -O0 (a host call's time is torch's around the launch more than the kernel's, at any
# level; bench/results/2026-11-29-cpu2-test-time-9 has the measures). Hidden visibility
# keeps the kernel's extern "C" symbol bound inside its own library (no interposition by a same-named symbol
# loaded earlier).
CXX_FLAGS = ("-std=c++17", "-O0", "-fno-builtin", "-shared", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off")
# A kernel library calls libm and libc only (no C++ runtime, no start files: it has no constructors), so it links
# against those alone.
LINK = ("-nostdlib", "-lm", "-lc", "-lgcc")
DEFAULT_CUDA_INCLUDE = Path("/usr/local/cuda/include")
_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp")


def compiler() -> list[str]:
    """The compiler command: $CXX (may carry arguments, e.g. 'ccache g++'), else g++, else c++."""
    configured = os.environ.get("CXX")
    if configured:
        command = shlex.split(configured)
        if command and shutil.which(command[0]):
            return [shutil.which(command[0]) or command[0], *command[1:]]
        raise RuntimeError(f"CXX={configured!r} is not an executable on PATH: set CXX to a C++17 compiler "
                           "(g++ >= 9 or clang++), or unset it to use g++")
    for name in ("g++", "c++"):
        found = shutil.which(name)
        if found:
            return [found]
    raise RuntimeError("autocuda.toolchain.host needs a C++17 compiler and none was found: install g++ "
                       "(e.g. `apt-get install g++`) or set CXX to the path of g++/clang++")


def cuda_include() -> Path:
    """The CUDA include folder: $CUDA_HOME/include, $CUDA_PATH/include, else /usr/local/cuda/include."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            include = Path(root) / "include"
            if (include / "cuda_fp16.h").is_file():
                return include
            raise RuntimeError(f"{var}={root!r}, but {include / 'cuda_fp16.h'} does not exist: point {var} at "
                               "a CUDA toolkit root (the folder holding include/cuda_fp16.h)")
    if (DEFAULT_CUDA_INCLUDE / "cuda_fp16.h").is_file():
        return DEFAULT_CUDA_INCLUDE
    raise RuntimeError("autocuda.toolchain.host needs the CUDA headers (cuda_fp16.h, cuda_bf16.h) and found none: "
                       "install the CUDA toolkit (or only its headers, e.g. `conda install -c nvidia cuda-cudart-dev`) "
                       "and set CUDA_HOME to its root (the folder holding include/cuda_fp16.h)")


def missing_compiler() -> str | None:
    """Why no C++ compiler runs here, or None when one does."""
    try:
        compiler_version(tuple(compiler()))
    except RuntimeError as error:
        return str(error)
    return None


def missing() -> str | None:
    """Why the host runner cannot compile here (no C++ compiler, no CUDA headers), or None when it can."""
    try:
        compiler()
        cuda_include()
    except RuntimeError as error:
        return str(error)
    return None


def compile_command(source: Path, output: Path) -> list[str]:
    return [*compiler(), *CXX_FLAGS, f"-I{cuda_include()}", "-o", str(output), str(source), *LINK]


def precompile_command(header: Path, output: Path) -> list[str]:
    """A precompiled header of `header`, built with the flags the units are compiled with (less the link's)."""
    flags = [f for f in CXX_FLAGS if f != "-shared"]
    return [*compiler(), *flags, f"-I{cuda_include()}", "-x", "c++-header", "-o", str(output), str(header)]


def identity() -> str:
    """Everything about the toolchain that changes a binary: compiler, its version, flags, CUDA headers."""
    return _identity(tuple(compiler()), str(cuda_include()))


@functools.cache
def compiler_version(command: tuple[str, ...]) -> str:
    """What `command --version` prints; a RuntimeError naming the compiler where it does not run."""
    try:
        return subprocess.run([*command, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise RuntimeError(f"the C++ compiler {' '.join(command)!r} does not run ({error}): install g++ "
                           "or set CXX to a working compiler") from error


@functools.cache
def _identity(command: tuple[str, ...], include: str) -> str:
    version = compiler_version(command)
    headers = hashlib.sha256()
    for name in _HEADERS:
        path = Path(include) / name
        headers.update(path.read_bytes() if path.is_file() else b"")
    return "\n".join([*command, version, *CXX_FLAGS, *LINK, include, headers.hexdigest()])
