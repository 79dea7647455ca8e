# ruff: noqa: B023  (the step functions run within the iteration that defines them)
"""The fused mixing backward with two neurons a thread: lane loops interleaved or one after another, at 128
registers (two blocks a multiprocessor) or unbounded (one), against one neuron a thread. PSN(8) at (8, 8M),
forward with two lanes throughout; steps queued behind a wait."""
import torch

import autocuda.codegen.mixing_kernel as mk
from autocuda.nn import PSN
from autocuda.spec.surrogate import ATan


class Sequential(mk.MixingKernel):
    template = "mixing_seq.cu.j2"  # the lanes one after another (the experiment's template, not kept)


T, N = 8, 8 * 1024 * 1024
original = mk.mixing_kernels


def variant(kind, bounds, dtype, surrogate):
    if kind == "one lane":
        return original(T, dtype, surrogate, 1)[2]
    cls = Sequential if kind == "sequential" else mk.MixingKernel
    k = cls(f"fused_{kind[:3]}_{bounds.replace(', ', '_')}_{dtype}", T, dtype, surrogate, True, True, 2)
    k.launch_bounds = bounds
    return k


def timed(step, reps=20):
    for _ in range(3):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


configs = [("one lane", ""), ("interleaved", "256, 2"), ("interleaved", "256, 1"), ("sequential", "256, 2"),
           ("sequential", "256, 1")]
for dtype in (torch.bfloat16, torch.float32):
    name = str(dtype)[6:]
    torch.manual_seed(0)
    layer = PSN(T).cuda()
    x = torch.randn(T, N, device="cuda", dtype=dtype).requires_grad_()
    fused = {c: variant(*c, name, ATan().frozen()) for c in configs}

    def use(config):
        def kernels(steps, dtype_name, surrogate, lanes=1):
            f, b, _ = original(steps, dtype_name, surrogate, lanes)
            return f, b, fused[config]
        mk.mixing_kernels = kernels

    def train():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()

    base = None
    for c in configs:
        use(c)
        train()
        got = (x.grad.clone(), layer.weight.grad.clone())
        base = base or got
        print(name, c, "grad_x equal", torch.equal(got[0], base[0]),
              "grad_w rel", float((got[1] - base[1]).norm() / base[1].norm()), flush=True)
    times = {}
    for _ in range(3):
        for c in configs:
            use(c)
            times.setdefault(c, []).append(timed(train))
    for c, t in times.items():
        print(f"{name:9} {c[0]:12} bounds {c[1] or '-':7} train step min {min(t):.4f} ms  "
              + " ".join(f"{v:.4f}" for v in t), flush=True)
