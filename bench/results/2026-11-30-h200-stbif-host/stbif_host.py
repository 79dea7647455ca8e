"""STBIFNode's and LIFNode's call at (T, N) = (8, 8M), float32, inference: the host's part (the call's return) and the
whole (to a synchronize), medians of 50; SpikingJelly's STBIFNode likewise; then a reset and a call at N = 1024."""
import time

import torch
from spikingjelly.activation_based.neuron import STBIFNode as SpikingJellySTBIF

import autocuda.nn as ann
from autocuda.call import native

x = torch.rand(8, 8 << 20, device="cuda")
ours = ann.STBIFNode(0.5, 8, sym=True, step_mode="m").to("cuda")
lif = ann.LIFNode(step_mode="m").to("cuda")
theirs = SpikingJellySTBIF(0.5, 8, sym=True, step_mode="m").to("cuda")
print("native", native.USE, native.loaded())


def timed(layer, calls: int = 50) -> tuple[float, float]:
    host, whole = [], []
    with torch.no_grad():
        for i in range(calls + 5):
            layer.reset()
            torch.cuda.synchronize()
            start = time.perf_counter()
            layer(x)
            returned = time.perf_counter()
            torch.cuda.synchronize()
            if i >= 5:
                host.append(returned - start)
                whole.append(time.perf_counter() - start)
    return sorted(host)[calls // 2] * 1e6, sorted(whole)[calls // 2] * 1e6


for name, layer in (("ours-stbif", ours), ("ours-lif", lif), ("sj-stbif", theirs)):
    print(name, "host us {:.1f} total us {:.1f}".format(*timed(layer)))
small = torch.rand(8, 1024, device="cuda")
for name, layer in (("ours-stbif", ours), ("ours-lif", lif)):
    with torch.no_grad():
        for _ in range(100):
            layer.reset()
            layer(small)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(1000):
            layer.reset()
            layer(small)
        torch.cuda.synchronize()
    print(name, "small N us per reset+call", (time.perf_counter() - start) * 1e3)
