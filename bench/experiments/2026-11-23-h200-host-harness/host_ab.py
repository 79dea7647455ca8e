"""Host time per call, LIF T=4 N=4096 on the GPU: ours (the tree on PYTHONPATH), SpikingJelly and torch's floors,
inference with torch.no_grad() entered per call and once around the loop. Best of 7 rounds of 500 calls (us)."""
import sys
import time

import torch

from autocuda import functional as F
from autocuda.spec.load import load_spec
from autocuda.surrogate import Sigmoid

dev = "cuda"
spec = load_spec("lif")
sg = Sigmoid(alpha=4.0)
params = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}
x = torch.randn(4, 4096, device=dev) * 2 + 0.5
xg = x.clone().requires_grad_()
g = torch.randn(4, 4096, device=dev)
v0 = torch.zeros(4096, device=dev)


def ours():
    return F.multi_step(spec, x, 0.0, surrogate=sg, **params)


def ours_train():
    spikes = F.multi_step(spec, xg, 0.0, surrogate=sg, **params)[0]
    return torch.autograd.grad(spikes, [xg], g, allow_unused=True)


def allocs():
    return torch.empty_like(x), x.new_empty(x.shape[-1])


try:
    from spikingjelly.activation_based import functional as sjf
    from spikingjelly.activation_based import surrogate as sjs
    sj_sg = sjs.Sigmoid(alpha=4.0)

    def sj():
        return sjf.lif_multi_step(x, v0, tau=2.0, v_threshold=1.0, v_reset=0.0, surrogate_function=sj_sg)
    sj()
except Exception as e:  # noqa: BLE001
    print("no SpikingJelly:", repr(e)[:200], file=sys.stderr)
    sj = None


def per_call_no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def best(fn, loop_no_grad=False, calls=500, rounds=7):
    with torch.set_grad_enabled(not loop_no_grad):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        result = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            result = min(result, (time.perf_counter() - start) / calls * 1e6)
    return result


tag = sys.argv[1] if len(sys.argv) > 1 else ""
rows = [("ours fwd, no_grad per call", per_call_no_grad(ours), False),
        ("ours fwd, no_grad around loop", ours, True),
        ("ours fwd+bwd", ours_train, False),
        ("floor 2 allocs, no_grad per call", per_call_no_grad(allocs), False),
        ("floor 2 allocs, no_grad around loop", allocs, True)]
if sj is not None:
    rows += [("sj fwd, no_grad per call", per_call_no_grad(sj), False), ("sj fwd, no_grad around loop", sj, True)]
for name, fn, loop in rows:
    print(f"{tag:6s} {name:40s} {best(fn, loop):8.1f}")
