"""GPU time of the fused BatchNorm + LIF layer's backward-through-time kernel (two per-channel parameters, a and
b, whose gradients are summed per channel), T=4, B=64, C=64, 32x32, from torch.profiler over 10 training steps.
argv[1]: a label."""
import sys

import torch

from autocuda.nn import BatchNormNeuron

T, B, C, H, W = 4, 64, 64, 32, 32
for dtype in (torch.float32, torch.bfloat16):
    layer = BatchNormNeuron(C, "lif", step_mode="m").cuda()
    x = (torch.randn(T, B, C, H, W, device="cuda") * 2).to(dtype).requires_grad_()
    g = torch.randn(T, B, C, H, W, device="cuda").to(dtype)

    def step():
        layer.neuron.reset()
        torch.autograd.backward(layer(x), g)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        if "fptt" in event.key or "bptt" in event.key:
            kernels["bptt" if "bptt" in event.key else "fptt"] = event.device_time_total / event.count
    print(f"{sys.argv[1]:4} {str(dtype):15} " + "  ".join(f"{k} {v:.1f} us" for k, v in sorted(kernels.items())),
          flush=True)
