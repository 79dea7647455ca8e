"""A training step of each parallel spiking neuron at (T, N) = (8, 8M): the wall time (median of 50 steps, host and
device in series) and the GPU's kernel time per step (the profiler's sum over 10 steps).
`PYTHONPATH=<tree> python gpu_time.py <tag>`."""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import autocuda.nn as our

CASES = {"PSN": lambda: our.PSN(T=8), "MaskedPSN": lambda: our.MaskedPSN(k=4, T=8, step_mode="m"),
         "SlidingPSN": lambda: our.SlidingPSN(k=4, step_mode="m")}


def timed(layer: torch.nn.Module, x: torch.Tensor) -> tuple[float, float, float]:
    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).sum().backward()

    for _ in range(5):
        step()
    times = []
    for _ in range(50):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 10 / 1e3
    return statistics.median(times) * 1e3, min(times) * 1e3, gpu


for name, build in CASES.items():
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        x = torch.rand(8, 8 << 20, device="cuda", dtype=dtype).requires_grad_(True)
        median, least, gpu = timed(build().to("cuda"), x)
        print(f"{sys.argv[1]} {name:11s} {str(dtype)[6:]:9s} wall median {median:.3f} ms  min {least:.3f}  "
              f"GPU kernels {gpu:.3f} ms/step", flush=True)
