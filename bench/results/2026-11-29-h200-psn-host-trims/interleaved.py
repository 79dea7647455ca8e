"""MaskedPSN's kept eased mask and SlidingPSN's banded matrix (`_Banded`) against the code before them (restored on
the class, call by call) and SpikingJelly 2.0's classes, interleaved in one process: one training step at (8, 8M)."""
import statistics
import time

import torch
from spikingjelly.activation_based.neuron import psn as sj

import autocuda.nn as our
from autocuda.nn import psn as ours_psn

NEW = {"masked_weight": our.MaskedPSN.masked_weight, "gen_gemm_weight": our.SlidingPSN.gen_gemm_weight}


def old_masked_weight(self):
    eased = self._lambda_.clamp(max=1.0)
    return (eased * self.mask0 + (1.0 - eased) * self.mask1) * self.weight


def old_gen_gemm_weight(self, T):
    padded = torch.cat((self.weight.new_zeros(1), self.weight))
    return padded[ours_psn._band(T, self.k, self.weight.device)]


def use(old):
    our.MaskedPSN.masked_weight = old_masked_weight if old else NEW["masked_weight"]
    our.SlidingPSN.gen_gemm_weight = old_gen_gemm_weight if old else NEW["gen_gemm_weight"]


def step_call(layer, x):
    def call():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        if hasattr(layer, "reset"):
            layer.reset()
        layer(x).sum().backward()
    return call


CASES = {"PSN": lambda m: m.PSN(T=8), "MaskedPSN": lambda m: m.MaskedPSN(k=4, T=8, step_mode="m"),
         "SlidingPSN": lambda m: m.SlidingPSN(k=4, step_mode="m")}
for name, build in CASES.items():
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.rand(8, 8 << 20, device="cuda", dtype=dtype).requires_grad_(True)
        calls = {"old": step_call(build(our).to("cuda", dtype), x), "new": None,
                 "sj": step_call(build(sj).to("cuda", dtype), x)}
        calls["new"] = calls["old"]
        times = {mode: [] for mode in calls}
        modes = list(times)
        for rep in range(36):
            for mode in modes[rep % 3:] + modes[:rep % 3]:  # each mode in each place of the order
                use(mode == "old")
                torch.cuda.synchronize()
                t = time.perf_counter()
                calls[mode]()
                torch.cuda.synchronize()
                if rep >= 6:
                    times[mode].append(time.perf_counter() - t)
        med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        print(f"{name} | {str(dtype)[6:]} | old {med['old']:.3f} ms | new {med['new']:.3f} ms | new/old "
              f"{med['new'] / med['old']:.2f} | SJ {med['sj']:.3f} ms | SJ/old {med['sj'] / med['old']:.2f}x | "
              f"SJ/new {med['sj'] / med['new']:.2f}x", flush=True)
