"""A reset and a multi-step call at (T, N) = (8, 64) on the host runner, us per call (the best of three rounds of
3000): run with AUTOCUDA_NATIVE=1 (the native path, as CUDA calls take it)."""
import time

import torch

import autocuda.nn as ann

x = torch.rand(8, 64)
layers = {"stbif": ann.STBIFNode(0.5, 8, sym=True, step_mode="m", backend="host"),
          "aaif": ann.ActivationAwareIFNode(0.75, 0.25, step_mode="m", backend="host"),
          "lif": ann.LIFNode(step_mode="m", backend="host")}


def per_call(layer, calls: int = 3000) -> float:
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            total = 0.0
            for _ in range(calls):
                layer.reset()
                start = time.perf_counter()
                layer(x)
                total += time.perf_counter() - start
            best = min(best, total / calls * 1e6)
    return best


for name, layer in layers.items():
    print(name, f"{per_call(layer):.1f} us")
