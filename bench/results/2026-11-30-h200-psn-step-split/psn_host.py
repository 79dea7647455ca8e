"""PSN training step at (8, 8M): host time per phase, GPU time alone, cProfile (bf16 and fp32).

Run from the repository root on one GPU:
    PYTHONPATH=$PWD python3 bench/results/2026-11-30-h200-psn-step-split/psn_host.py
"""
import cProfile
import io
import pstats
import statistics
import time

import torch

from autocuda.nn import PSN

T, N = 8, 8 * 1024 * 1024


def measure(dtype: torch.dtype) -> None:
    layer = PSN(T).cuda()
    x = torch.rand(T, N, device="cuda", dtype=dtype).requires_grad_()

    def step(marks: list | None = None) -> None:
        t0 = time.perf_counter()
        out = layer(x)
        t1 = time.perf_counter()
        loss = out.sum()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        if marks is not None:
            marks.append((t1 - t0, t2 - t1, t3 - t2))

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    marks: list = []
    for _ in range(50):
        step(marks)
    torch.cuda.synchronize()
    for i, name in enumerate(("forward", "sum", "backward")):
        print(dtype, f"host {name} median {statistics.median(m[i] for m in marks) * 1e6:.0f} us", flush=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000_000)
    start.record()
    for _ in range(20):
        step()
    end.record()
    torch.cuda.synchronize()
    print(dtype, f"gpu per step (queued behind a wait) {start.elapsed_time(end) / 20:.3f} ms", flush=True)
    t = time.perf_counter()
    for _ in range(20):
        step()
        torch.cuda.synchronize()
    print(dtype, f"step with a sync {(time.perf_counter() - t) / 20 * 1e3:.3f} ms", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
    print(text.getvalue()[:3500], flush=True)


for dtype in (torch.bfloat16, torch.float32):
    measure(dtype)
