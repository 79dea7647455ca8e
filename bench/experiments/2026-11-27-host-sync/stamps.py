"""Inclusive host time of the functions on one neuron layer's forward and backward path (NIR LIF layer,
[32, 256, 1024] float32 on the GPU), by wrapping them with perf_counter stamps; the wrappers' own cost
(~0.3 us each) is included."""
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import nir_mlp  # noqa: E402

from autocuda import ops  # noqa: E402
from autocuda.runtime import driver, neuron_launch  # noqa: E402

TOTALS = collections.defaultdict(list)


def stamp(owner, name, label):
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTALS[label].append(1e6 * (time.perf_counter() - start))
    setattr(owner, name, wrapped)


stamp(ops, "_backward", "ops._backward")
stamp(ops._BackwardForm, "run", "_BackwardForm.run")
stamp(ops.ForwardForm, "run", "ForwardForm.run")
stamp(neuron_launch.KernelCall, "__call__", "KernelCall.__call__")
stamp(neuron_launch, "_layout", "_layout")
stamp(neuron_launch.Recipe, "run_args", "Recipe.run_args")
stamp(neuron_launch.Recipe, "_launch", "Recipe._launch")
stamp(driver.Launcher, "launch", "Launcher.launch")
stamp(ops, "_dense_all", "ops._dense_all")
stamp(ops, "_dense", "ops._dense")


def main():
    device = torch.device("cuda")
    graph = nir_mlp.make_graph(1024)
    model = nir_mlp.build("ours", graph, device)
    lif = next(m for m in model.nodes._modules.values() if hasattr(m, "spec"))
    h = torch.rand(32, 256, 1024, device=device)
    for label, grad_on in (("fwd", False), ("fwd+bwd", True)):
        whole, fwd, bwd = [], [], []
        for i in range(300):
            lif.reset()
            xs = h.detach().requires_grad_(grad_on)
            torch.cuda.synchronize()
            s = time.perf_counter()
            out = lif(xs)
            m = time.perf_counter()
            if grad_on:
                out.backward(torch.ones_like(out))
            e = time.perf_counter()
            whole.append(1e6 * (e - s))
            fwd.append(1e6 * (m - s))
            bwd.append(1e6 * (e - m))
            if i == 99:
                TOTALS.clear()
        print(f"{label}: whole {statistics.median(whole):.1f} us (forward {statistics.median(fwd):.1f}, "
              f"backward incl. ones_like {statistics.median(bwd):.1f})")
        for name, values in TOTALS.items():
            print(f"    {name:24} calls/iter {len(values) / 200:4.1f}  median {statistics.median(values):7.1f} us")
        TOTALS.clear()


main()
