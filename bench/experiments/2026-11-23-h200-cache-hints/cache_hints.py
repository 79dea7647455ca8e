"""Streaming cache hints (__ldcs loads, __stcs stores) on the sequences' vector accesses of the generated kernels,
against the kernels as generated: same arguments, alternating launches, CUDA events, median of rounds.

Run on a GPU from a checkout: PYTHONPATH=$PWD python3 cache_hints.py lif,parametric_lif,izhikevich,adex
"""
import re
import statistics
import sys

import torch

from autocuda import benchmark as bench
from autocuda.runtime import neuron as rn
from autocuda.runtime.launch import PackedLaunch, current_stream_ptr

captured = []
_launch = rn.Recipe._launch


def spy(self, values, n, like, backend):
    captured.append((self.kernel, tuple(values), n))
    return _launch(self, values, n, like, backend)


rn.Recipe._launch = spy

STORE = re.compile(r"\*reinterpret_cast<(\w+)\*>\(&(\w+)\[([^\]]+)\]\) = ac_vec;")
LOAD = re.compile(r"= \*reinterpret_cast<const (\w+)\*>\(&(\w+)\[([^\]]+)\]\);")


def hinted(src, loads, stores):
    if stores:
        src = STORE.sub(lambda m: f"__stcs(reinterpret_cast<{m[1]}*>(&{m[2]}[{m[3]}]), ac_vec);", src)
    if loads:
        src = LOAD.sub(lambda m: f"= __ldcs(reinterpret_cast<const {m[1]}*>(&{m[2]}[{m[3]}]));", src)
    return src


def timed(launch, kernel, values, n):
    """Microseconds per launch, ten back to back."""
    grid = ((-(-n // kernel.lanes) + kernel.block - 1) // kernel.block,)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = current_stream_ptr(0)
    start.record()
    for _ in range(10):
        launch(grid, (kernel.block,), values, stream)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 10 * 1e3


def kernels_of(workload, dtype, steps, neurons):
    """The kernels an inference and a training call launch, with the arguments of their last launch (outputs
    kept alive in `keep`)."""
    data = bench.Case.draw(workload, dtype, steps, neurons, torch.device("cuda"))
    seen, keep = {}, []
    for training in (False, True):
        case = data.mode(training)
        captured.clear()
        run = bench.call(case, bench.ours(case))
        keep += [run(), run()]
        torch.cuda.synchronize()
        for kernel, values, n in captured[-(1 + training):]:
            seen[kernel.kernel_name] = (kernel, values, n)
    return seen, keep


def main(keys):
    for key in keys:
        for dtype in (torch.float32, torch.bfloat16):
            for steps, neurons in ((8, 8 << 20), (64, 1 << 20)):
                seen, _keep = kernels_of(bench.WORKLOADS[key], dtype, steps, neurons)
                for name, (kernel, values, n) in seen.items():
                    params = tuple(kernel.cparams.values())
                    variants = {"plain": kernel.full_codes, "st.cs": hinted(kernel.full_codes, False, True),
                                "ld.cs": hinted(kernel.full_codes, True, False),
                                "both": hinted(kernel.full_codes, True, True)}
                    launches = {v: PackedLaunch(src, kernel.kernel_name, params, 0) for v, src in variants.items()}
                    times = {v: [] for v in variants}
                    for _ in range(7):
                        for v, launch in launches.items():
                            times[v].append(timed(launch, kernel, values, n))
                    med = {v: statistics.median(t) for v, t in times.items()}
                    print(f"{key:14s} {str(dtype)[6:]:8s} T={steps:3d} {'/'.join(name.split('_')[-4:-2]):14s} "
                          + "  ".join(f"{v} {m:7.1f} us ({m / med['plain']:.3f})" for v, m in med.items()),
                          flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","))
