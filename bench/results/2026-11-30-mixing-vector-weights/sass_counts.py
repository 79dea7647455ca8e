"""Static counts of the mixing kernels' machine code (sm_90): instructions, global loads (LDG), registers, spills.

    PYTHONPATH=<tree> python sass_counts.py CUOBJDUMP  # prints one line per kernel of that tree's generator

Compiles each kernel's source with nvcc -cubin -arch=sm_90 -O3 (ptxas -v for registers and spills) and disassembles
it with CUOBJDUMP (CUDA's cuobjdump; triton's wheel carries one).
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from autocuda.codegen.mixing_kernel import mixing_kernels
from autocuda.spec.surrogate import ATan

cuobjdump = sys.argv[1]
with tempfile.TemporaryDirectory() as folder:
    for dtype in ("bfloat16", "float32"):
        for kind, kernel in zip(("forward", "backward", "fused backward"), mixing_kernels(8, dtype, ATan().frozen())):
            source, cubin = Path(folder, "k.cu"), Path(folder, "k.cubin")
            source.write_text(kernel.full_codes)
            ptxas = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(cubin),
                                    str(source)], capture_output=True, text=True, check=True).stderr
            sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
            code = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
            registers = re.search(r"Used (\d+) registers", ptxas).group(1)
            spills = re.search(r"(\d+) bytes spill stores", ptxas).group(1)
            print(f"T=8 {dtype:9} {kind:15} instructions {len(code):5}  LDG {sum('LDG' in c for c in code):4}  "
                  f"registers {registers:>4}  spill stores {spills} B")
