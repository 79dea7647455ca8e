"""GPU time of the parallel spiking neurons' training step at (8, 8M), without the host: the steps are queued behind
a 100 ms wait, so the GPU never idles for the host; also the time of each mixing kernel (torch.profiler). Each step
drops the gradients first, as a training loop's zero_grad does (no AccumulateGrad kernels).

Run with one tree on PYTHONPATH: python3 gpu_step.py <label>
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from autocuda.nn import PSN, MaskedPSN, SlidingPSN

T, N = 8, 8 * 1024 * 1024
label = sys.argv[1]
layers = {
    "PSN": lambda: PSN(T),
    "MaskedPSN": lambda: MaskedPSN(k=4, T=T, step_mode="m"),
    "SlidingPSN": lambda: SlidingPSN(k=4, step_mode="m"),
}
for name, build in layers.items():
    for dtype in (torch.bfloat16, torch.float32):
        layer = build().cuda()
        x = torch.rand(T, N, device="cuda", dtype=dtype).requires_grad_()

        def step() -> None:
            x.grad = None  # noqa: B023 (called within the iteration that defines it)
            layer.zero_grad(set_to_none=True)  # noqa: B023
            layer(x).sum().backward()  # noqa: B023 (called within the iteration that defines it)

        for _ in range(10):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(100_000_000)
            start.record()
            for _ in range(20):
                step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 20)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        kernels = {}
        for event in prof.key_averages():
            if event.device_type.name == "CUDA" and ("mix" in event.key.lower() or "psn" in event.key.lower()):
                kernels[event.key[:40]] = event.device_time_total / 10 / 1000
        mixing = sum(kernels.values())
        print(f"{label} {name:10s} {str(dtype)[6:]:9s} gpu step min {min(times):.3f} ms  "
              f"mixing kernels {mixing:.3f} ms  {kernels}", flush=True)
