"""Where a compiled (default mode) VGG step's time goes: ours against the compiled loop, T=4 B=64, float32 and AMP
bf16, each step timed unprofiled, then 10 steps under torch.profiler (GPU kernel time per step, the top kernels).

    python bench/results/2026-11-28-h200-compile-default/profile_compile.py OUT ours-compiled-cl,loop-compiled-cl
"""
import contextlib
import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from bench import network

T, B = 4, 64


def measure(system: str, precision: str) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = network.build(system, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    if system.endswith("-cl"):
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    target = torch.randint(0, 10, (B,), device=device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16"
                else contextlib.nullcontext())

    def step() -> None:
        network._reset(model)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()

    for _ in range(8):
        step()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / 20 * 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: -e.device_time_total)
    return {"step_ms": statistics.median(times),
            "gpu_kernel_ms": sum(e.device_time_total for e in kernels) / 10 / 1e3,
            "n_kernels": sum(e.count for e in kernels) / 10,
            "top": [(e.key[:90], round(e.device_time_total / 10 / 1e3, 4), e.count // 10) for e in kernels[:25]]}


def main() -> None:
    out, systems = sys.argv[1], sys.argv[2].split(",")
    results = {}
    for system in systems:
        for precision in ("float32", "bfloat16"):
            row = results[f"{system}-{precision}"] = measure(system, precision)
            print(system, precision, row["step_ms"], row["gpu_kernel_ms"], row["n_kernels"], flush=True)
    with open(f"{out}/profile.json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
