"""The PSN family's host time per bfloat16 training step against LIFNode and a trivial Function (README.md)."""
# ruff: noqa: B023
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import autocuda.nn as ann

LAYERS = {"PSN": lambda: ann.PSN(T=8), "MaskedPSN": lambda: ann.MaskedPSN(k=4, T=8, step_mode="m"),
          "SlidingPSN": lambda: ann.SlidingPSN(k=4, step_mode="m"), "LIF": lambda: ann.LIFNode(step_mode="m")}


class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def median_us(step, sync: bool) -> float:
    times = []
    for _ in range(200):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


for n in (1024, 8 << 20):
    for name in (*LAYERS, "trivial"):
        layer = LAYERS[name]().to("cuda", torch.bfloat16) if name in LAYERS else None
        x = torch.rand(8, n, device="cuda", dtype=torch.bfloat16).requires_grad_()

        def step() -> None:
            if layer is not None:
                layer.zero_grad(set_to_none=True)
                if hasattr(layer, "reset"):
                    layer.reset()
            x.grad = None
            y = layer(x) if layer is not None else Trivial.apply(x)
            y.sum().backward()

        for _ in range(20):
            step()
        synced, host = median_us(step, True), median_us(step, False)
        print(f"N={n} {name:10s} synced step {synced / 1e3:.3f} ms  host enqueue {host:.0f} us", flush=True)
        if n == 1024 and name in ("PSN", "SlidingPSN"):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(50):
                    step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
