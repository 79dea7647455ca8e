# ruff: noqa: B023  (the step functions run within the iteration that defines them)
"""One neuron a thread against two in the mixing kernels over T: forward and training step (the fused backward for
T <= 8, else the backward writing grad_h and torch's products), T x N = 64M elements, one process, the two
interleaved, steps queued behind a wait; the min of three rounds."""
import torch

from autocuda.call import mixing
from autocuda.spec.surrogate import ATan

original = mixing.word_lanes


def timed(step, reps=10):
    for _ in range(2):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


for dtype in (torch.bfloat16, torch.float32):
    for steps in (4, 12, 16, 32, 64):
        neurons = (64 << 20) // steps
        x = torch.randn(steps, neurons, device="cuda", dtype=dtype).requires_grad_()
        weight = torch.randn(steps, steps, device="cuda", requires_grad=True)
        bias = torch.randn(steps, 1, device="cuda", requires_grad=True)

        def forward():
            with torch.no_grad():
                mixing.fire(x, weight, bias, ATan())

        def train():
            x.grad = weight.grad = bias.grad = None
            mixing.fire(x, weight, bias, ATan()).sum().backward()

        times: dict = {}
        for _ in range(3):
            for lanes in (1, 2):
                mixing.word_lanes = lambda rows: min(lanes, original(rows))
                for name, step in (("forward", forward), ("training", train)):
                    times.setdefault((name, lanes), []).append(timed(step))
        for name in ("forward", "training"):
            one, two = min(times[(name, 1)]), min(times[(name, 2)])
            print(f"{str(dtype)[6:]:9} T={steps:2} {name:8} one lane {one:.4f} ms  two lanes {two:.4f} ms  "
                  f"ratio {two / one:.3f}", flush=True)
        mixing.word_lanes = original
