"""Layers with tensor parameters of one value (STBIFNode's buffers, ParametricLIFNode's w) with the native path on
(their calls' plans take the parameters as tensors) and off (the bound launch: what they ran before), and
SpikingJelly 2.0's classes, interleaved call by call in one process, the order rotated."""
import statistics
import sys
import time

import torch
from spikingjelly.activation_based import neuron as sj

import autocuda.nn as our
from autocuda.call import native

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20


def forward_call(layer, x):
    def call():
        layer.reset()
        with torch.no_grad():
            layer(x)
    return call


def training_call(layer, x):
    leaf = x.clone().requires_grad_(True)

    def call():
        layer.reset()
        layer.zero_grad(set_to_none=True)
        leaf.grad = None
        layer(leaf).sum().backward()
    return call


CASES = {"STBIFNode forward": (lambda m: m.STBIFNode(0.5, 8, sym=True, step_mode="m"), forward_call),
         "ParametricLIFNode training": (lambda m: m.ParametricLIFNode(step_mode="m"), training_call)}
for name, (build, make) in CASES.items():
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(8, N, device="cuda") + 0.5).to(dtype)
        calls = {"native on": make(build(our).to("cuda", dtype), x), "sj": make(build(sj).to("cuda", dtype), x)}
        calls["native off"] = calls["native on"]
        times = {m: [] for m in ("native off", "native on", "sj")}
        modes = list(times)
        for rep in range(36):
            for mode in modes[rep % 3:] + modes[:rep % 3]:
                native.USE = mode != "native off"
                torch.cuda.synchronize()
                t = time.perf_counter()
                calls[mode]()
                torch.cuda.synchronize()
                if rep >= 6:
                    times[mode].append(time.perf_counter() - t)
        med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        print(f"{name} | {str(dtype)[6:]} | N={N} | off {med['native off']:.3f} ms | on {med['native on']:.3f} ms | "
              f"on/off {med['native on'] / med['native off']:.2f} | SJ {med['sj']:.3f} ms | "
              f"SJ/on {med['sj'] / med['native on']:.2f}x", flush=True)
