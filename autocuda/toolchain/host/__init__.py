"""Run the CUDA source autocuda emits on the CPU, for testing without a GPU.

`launch(source, name, params, grid, block, args, device)` is the "host" backend of `CKernel.__call__`:
the kernel source is compiled with the system C++ compiler together with `shim.h` (host meanings for the
CUDA built-ins) and a wrapper that runs every block and thread one after another. Libraries are cached in
memory and under $AUTOCUDA_CACHE_DIR/host (default ~/.cache/autocuda/host), beside the shim precompiled once
per toolchain (`shim-<digest>/shim.h.gch`); `stats` counts how kernels were obtained ("memory", "disk",
"compiled"). `load_kernels` compiles many kernels a compiler run.
"""
from .runner import HostKernel, launch, load_kernel, load_kernels, stats, translation_unit

__all__ = ["HostKernel", "launch", "load_kernel", "load_kernels", "stats", "translation_unit"]
