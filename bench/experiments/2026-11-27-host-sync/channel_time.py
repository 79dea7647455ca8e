"""Kernel time of a training step of a layer with a per-channel learnable parameter (parametric LIF with w of
shape [C, 1, 1], the BatchNorm-fused block's shape: T=4, B=64, C=64, 32x32), forward + backward through time;
the GPU is held while the host queues the step, so this is kernel time only. argv[1]: a label."""
import statistics
import sys

import torch

from autocuda import functional as F

T, B, C, H, W = 4, 64, 64, 32, 32
for dtype in (torch.float32, torch.bfloat16):
    x = (torch.rand(T, B, C, H, W, device="cuda") * 2).to(dtype).requires_grad_()
    g = torch.randn(T, B, C, H, W, device="cuda").to(dtype)
    w = torch.linspace(-1, 1, C, device="cuda").reshape(C, 1, 1).requires_grad_()

    def step():
        spikes = F.multi_step("parametric_lif", x, w=w)[0]
        torch.autograd.backward(spikes, g)
    for _ in range(3):
        step()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(5_000_000)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    print(f"{sys.argv[1]:4} {str(dtype):15} {statistics.median(times):.4f} ms  grad_w[:3] {w.grad[:3].flatten().tolist()}",
          flush=True)
    w.grad = None
