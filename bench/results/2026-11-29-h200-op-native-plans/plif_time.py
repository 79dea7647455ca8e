"""Host-bound call time of layers with a one-value tensor parameter and of functional calls (CUDA, small N):
ParametricLIFNode forward and forward+backward, STBIFNode forward, multi_step with a 0-d tensor tau. Median of 7."""
import statistics
import time

import torch

from autocuda import nn
from autocuda.call import functional as F

DEVICE = "cuda"
x = torch.rand(4, 4096, device=DEVICE) * 2
xg = x.clone().requires_grad_()
plif = nn.ParametricLIFNode(step_mode="m").to(DEVICE)
stbif = nn.STBIFNode(torch.tensor(1.0), 4, step_mode="m").to(DEVICE)
tau = torch.tensor(2.0, device=DEVICE)


def plif_forward() -> None:
    plif.reset()
    with torch.no_grad():
        plif(x)


def plif_train() -> None:
    plif.reset()
    plif(xg).sum().backward()


def stbif_forward() -> None:
    stbif.reset()
    with torch.no_grad():
        stbif(x)


def functional_tensor_tau() -> None:
    with torch.no_grad():
        F.multi_step("lif", x, 0.0, tau=tau)


def timed(fn, n: int = 400) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


cases = [("plif forward", plif_forward), ("plif forward+backward", plif_train), ("stbif forward", stbif_forward),
         ("multi_step tensor tau", functional_tensor_tau)]
times: dict[str, list[float]] = {name: [] for name, _ in cases}
for r in range(7):
    for name, fn in cases[r % len(cases):] + cases[:r % len(cases)]:
        times[name].append(timed(fn))
for name, values in times.items():
    print(f"{name:24s} {statistics.median(values):8.1f} us")
