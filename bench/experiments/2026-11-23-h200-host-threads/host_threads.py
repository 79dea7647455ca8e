"""Host time per call (LIF T=4 N=4096) with torch's autograd multithreading on (default) and off
(`torch.autograd.set_multithreading_enabled(False)`: backward runs on the calling thread), next to torch's floors.
Also: time spent inside our backward (Python, worker or calling thread)."""
import statistics
import time

import torch

from autocuda import benchmark as B
from autocuda import functional as F
from autocuda import ops
from autocuda.spec.load import load_spec
from autocuda.surrogate import Sigmoid

dev = "cuda"
spec = load_spec("lif")
sg = Sigmoid(alpha=4.0)
params = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}
x = torch.randn(4, 4096, device=dev) * 2 + 0.5
xg = x.clone().requires_grad_()
g = torch.randn(4, 4096, device=dev)


_sj = B.SpikingJelly.load(True)
print("sj:", _sj.version, _sj.missing)


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        h = torch.empty_like(x)
        ctx.save_for_backward(h)
        ctx.mark_non_differentiable(h)
        return torch.empty_like(x), x.new_empty(x.shape[-1]), h

    @staticmethod
    def backward(ctx, grad_spike, grad_v, grad_h):
        return torch.empty_like(ctx.saved_tensors[0])


def ours_fwd():
    with torch.no_grad():
        return F.multi_step(spec, x, 0.0, surrogate=sg, **params)


def ours_fwd_grad():
    return F.multi_step(spec, xg, 0.0, surrogate=sg, **params)


def ours_train():
    spikes, _, _ = F.multi_step(spec, xg, 0.0, surrogate=sg, **params)
    return torch.autograd.grad(spikes, [xg], g, allow_unused=True)


def bare_train():
    return torch.autograd.grad(Bare.apply(xg)[0], [xg], g, allow_unused=True)


def bare_fwd_grad():
    return Bare.apply(xg)


def mul_train():
    return torch.autograd.grad(xg * 2, [xg], g, allow_unused=True)


rows = {"ours fwd (no_grad)": ours_fwd, "ours fwd (grad, no bwd)": ours_fwd_grad, "ours fwd+bwd": ours_train,
        "bare Function fwd (grad)": bare_fwd_grad, "bare Function fwd+bwd": bare_train, "x*2 + grad": mul_train}
if _sj.functional is not None:
    _case = B.Case.draw(B.WORKLOADS["lif"], torch.float32, 4, 4096, torch.device(dev)).mode(True)
    rows["sj fwd+bwd"] = B.call(_case, _sj.forward(_case))
    _icase = B.Case.draw(B.WORKLOADS["lif"], torch.float32, 4, 4096, torch.device(dev))
    rows["sj fwd (no_grad)"] = B.call(_icase, _sj.forward(_icase))


# time inside our backward
spent = []
orig = ops._Eager.backward


def timed_backward(ctx, *grads):
    t0 = time.perf_counter()
    out = orig(ctx, *grads)
    spent.append(time.perf_counter() - t0)
    return out


def per_call(fn, calls=400):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


results = {}
for fn in rows.values():
    for _ in range(100):
        fn()
for _ in range(5):
    for mt in (True, False):
        with torch.autograd.set_multithreading_enabled(mt):
            for name, fn in rows.items():
                results.setdefault((name, mt), []).append(per_call(fn))
print(torch.cuda.get_device_name(), "torch", torch.__version__)
print(f"{'':28s} {'MT on':>9s} {'MT off':>9s}   (us per call, median of 5 rounds x 400)")
for name in rows:
    on, off = statistics.median(results[(name, True)]), statistics.median(results[(name, False)])
    print(f"{name:28s} {on:9.1f} {off:9.1f}")

ops._Eager.backward = staticmethod(timed_backward)
for mt in (True, False):
    with torch.autograd.set_multithreading_enabled(mt):
        spent.clear()
        for _ in range(400):
            ours_train()
        torch.cuda.synchronize()
        print(f"inside our backward (MT {'on' if mt else 'off'}): median {statistics.median(spent) * 1e6:.1f} us")
