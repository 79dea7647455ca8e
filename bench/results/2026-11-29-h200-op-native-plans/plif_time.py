"""Host-bound call time of layers with a one-value tensor parameter and of functional calls (CUDA, small N):
ParametricLIFNode forward and forward+backward, STBIFNode forward, multi_step with a 0-d tensor tau. Median of 7."""
import statistics, sys, time, torch
from autocuda import nn
from autocuda.call import functional as F
dev = "cuda"
x = torch.rand(4, 4096, device=dev) * 2

xg = x.clone().requires_grad_()
plif = nn.ParametricLIFNode(step_mode="m").to(dev)
stbif = nn.STBIFNode(torch.tensor(1.0), 4, step_mode="m").to(dev)
tau = torch.tensor(2.0, device=dev)
def plif_fwd():
    plif.reset()
    with torch.no_grad(): plif(x)
def plif_train():
    plif.reset(); plif(xg).sum().backward()
def stbif_fwd():
    stbif.reset()
    with torch.no_grad(): stbif(x)
def func_tensor():
    with torch.no_grad(): F.multi_step("lif", x, 0.0, tau=tau)
def timed(fn, n=400):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6
cases = [("plif forward", plif_fwd), ("plif forward+backward", plif_train), ("stbif forward", stbif_fwd),
         ("multi_step tensor tau", func_tensor)]
res = {name: [] for name, _ in cases}
for r in range(7):
    for name, fn in cases[r % len(cases):] + cases[:r % len(cases)]:
        res[name].append(timed(fn))
for name, v in res.items(): print(f"{name:24s} {statistics.median(v):8.1f} us")
