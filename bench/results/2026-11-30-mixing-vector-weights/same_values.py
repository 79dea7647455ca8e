"""The mixing kernels' outputs on the host runner, saved for a comparison between trees:

    PYTHONPATH=<tree> AUTOCUDA_CACHE_DIR=<a cache per tree> python same_values.py OUT.pt
"""
import sys

import torch

from autocuda.call import mixing
from autocuda.spec.surrogate import ATan

out = {}
for dtype in (torch.float32, torch.bfloat16, torch.float64):
    for steps in (3, 6, 8, 9):
        for det in (False, True):
            g = torch.Generator().manual_seed(steps)
            rows = (torch.randn(steps, 41, generator=g, dtype=torch.float64) * 1.5).to(dtype).requires_grad_()
            w = torch.randn(steps, steps, generator=g, dtype=torch.float64).requires_grad_()
            b = torch.randn(steps, 1, generator=g, dtype=torch.float64).requires_grad_()
            torch.use_deterministic_algorithms(det)
            s = mixing.fire(rows, w, b, ATan(), backend="host")
            scale = torch.linspace(0.5, 1.5, s.numel(), dtype=torch.float64).view(s.shape).to(s.dtype)
            gr = torch.autograd.grad((s * scale).sum(), (rows, w, b))
            out[(str(dtype), steps, det)] = (s, *gr)
torch.save(out, sys.argv[1])
