"""SlidingPSN's [T, T] matrix built three ways: values checked in float64, host time interleaved (README.md)."""
import functools
import statistics
import time

import torch
import torch.nn.functional as F

import autocuda.nn as ann
from autocuda.nn import psn


@functools.lru_cache(maxsize=64)
def placement_t(steps, k, device, dtype):  # [T*T, k]
    return psn._placement(steps, k, device, dtype).T.contiguous()


@functools.lru_cache(maxsize=64)
def band_flat(steps, k, device):
    return psn._band(steps, k, device).reshape(-1)


VARIANTS = {
    "banded": lambda self, steps: psn._Banded.apply(self.weight, steps),
    "mv": lambda self, steps: torch.mv(placement_t(steps, self.k, self.weight.device, self.weight.dtype),
                                       self.weight).view(steps, steps),
    "index_select": lambda self, steps: F.pad(self.weight, (1, 0)).index_select(
        0, band_flat(steps, self.k, self.weight.device)).view(steps, steps),
}

reference = ann.SlidingPSN(k=4, step_mode="m").double()
results = {}
for name, build in VARIANTS.items():
    reference.weight = torch.nn.Parameter(reference.weight.detach().clone())
    matrix = build(reference, 8)
    (matrix * torch.arange(64.0).view(8, 8).double()).sum().backward()
    results[name] = (matrix.detach(), reference.weight.grad.clone())
for name, (matrix, grad) in results.items():
    print("check", name, bool((matrix == results["banded"][0]).all()), bool((grad == results["banded"][1]).all()))

x = torch.rand(8, 1024, device="cuda", dtype=torch.bfloat16).requires_grad_()
layers = {name: type("S_" + name, (ann.SlidingPSN,), {"gen_gemm_weight": build})(k=4, step_mode="m")
          for name, build in VARIANTS.items()}
layers["PSN"] = ann.PSN(T=8)
layers = {name: layer.to("cuda", torch.bfloat16) for name, layer in layers.items()}


def step(layer) -> None:
    layer.zero_grad(set_to_none=True)
    if hasattr(layer, "reset"):
        layer.reset()
    x.grad = None
    layer(x).sum().backward()


for layer in layers.values():
    for _ in range(30):
        step(layer)
times = {name: [] for name in layers}
for _ in range(1500):
    for name, layer in layers.items():
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(layer)
        times[name].append(time.perf_counter() - start)
torch.cuda.synchronize()
for name, values in times.items():
    values.sort()
    print(f"{name:12s} host enqueue median {statistics.median(values) * 1e6:.0f} us  "
          f"p10 {values[len(values) // 10] * 1e6:.0f} us", flush=True)
