"""Does a training step's backward launch push and pop the device's context (torch's autograd worker thread has
no current driver context)? Counts the pushes and times the host per training call.

Run on a GPU from a checkout: PYTHONPATH=$PWD python3 ctx_probe.py
"""
import time

import torch

from autocuda import functional as F
from autocuda.runtime import driver
from autocuda.spec.load import load_spec
from autocuda.surrogate import Sigmoid

pushes = []
enter = driver._in_context.__enter__


def counting(self):
    enter(self)
    pushes.append(self.pushed)


driver._in_context.__enter__ = counting
spec, sg = load_spec("lif"), Sigmoid(alpha=4.0)
x = (torch.randn(4, 4096, device="cuda") * 2 + 0.5).requires_grad_()
g = torch.randn(4, 4096, device="cuda")


def train():
    s = F.multi_step(spec, x, 0.0, surrogate=sg, tau=2.0, v_threshold=1.0, v_reset=0.0)[0]
    return torch.autograd.grad(s, [x], g)


for _ in range(50):
    train()
torch.cuda.synchronize()
pushes.clear()
best = 1e9
for _ in range(7):
    t = time.perf_counter()
    for _ in range(500):
        train()
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t) / 500 * 1e6)
print(f"pushes per training call: {sum(pushes) / 3500:.2f} (context switches entered {len(pushes) / 3500:.2f}); "
      f"best {best:.1f} us per call")
