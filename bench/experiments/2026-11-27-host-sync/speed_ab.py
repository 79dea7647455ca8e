"""Training-step kernel time (forward + backward through time) of a few specs, with NVRTC's default FMA
contraction or --fmad=false (argv[1]: "fmad" or "default"); run each in its own process, alternating."""
import statistics
import sys

import torch

from autocuda import functional as F
from autocuda.runtime import compile as compile_stage

if sys.argv[1] == "fmad":
    compile_stage.NVRTC_OPTIONS = (*compile_stage.NVRTC_OPTIONS, "--fmad=false")
T, N = 16, 1 << 22
for name in ("lif", "parametric_lif", "alif", "izhikevich"):
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.rand(T, N, device="cuda") * 2).to(dtype).requires_grad_()
        g = torch.randn(T, N, device="cuda").to(dtype)
        params = {"w": torch.full((N,), 0.1, device="cuda", requires_grad=True)} if name == "parametric_lif" else {}

        def step():
            spikes = F.multi_step(name, x, **params)[0]
            torch.autograd.backward(spikes, g)
        for _ in range(3):
            step()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(5_000_000)  # the GPU waits while the host queues the step: kernel time only
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        print(f"{sys.argv[1]:8} {name:15} {str(dtype):15} {statistics.median(times):.4f} ms", flush=True)
