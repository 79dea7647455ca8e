"""Where a small training call's backward spends host time (LIF, T=4, N=4096, float32): the inclusive time of our
autograd backward (`ops._Eager.backward`), of the backward form's run and of the launch, each summed over
calls by wrappers, against the whole `forward + backward` call and the bare function's. Prints a table; writes
backward_parts.json to the folder given."""
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from autocuda import ops  # noqa: E402
from autocuda.functional import multi_step  # noqa: E402
from autocuda.runtime import neuron_launch  # noqa: E402
from autocuda.runtime.launch import PackedLaunch  # noqa: E402
from bench.host_floor import Bare  # noqa: E402

spent = {"ops._Eager.backward": 0.0, "ops._BackwardForm.run": 0.0, "BoundLaunch.__call__ (backward)": 0.0,
         "PackedLaunch.__call__ (backward)": 0.0}
inside = [False]


def timed(name, fn, only_backward=False):
    def wrapper(*args, **kwargs):
        if only_backward and not inside[0]:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
    return wrapper


original_backward = ops._Eager.backward


def backward(ctx, *grads):
    inside[0] = True
    t0 = time.perf_counter()
    try:
        return original_backward(ctx, *grads)
    finally:
        spent["ops._Eager.backward"] += time.perf_counter() - t0
        inside[0] = False


ops._Eager.backward = staticmethod(backward)
ops._BackwardForm.run = timed("ops._BackwardForm.run", ops._BackwardForm.run)
neuron_launch.BoundLaunch.__call__ = timed("BoundLaunch.__call__ (backward)", neuron_launch.BoundLaunch.__call__, True)
PackedLaunch.__call__ = timed("PackedLaunch.__call__ (backward)", PackedLaunch.__call__, True)

device = sys.argv[2] if len(sys.argv) > 2 else "cuda"  # cpu: a smoke test on the host runner
backend = None if device == "cuda" else "host"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
x = (torch.rand(4, 4096, device=device) * 2).requires_grad_(True)
grad = torch.ones_like(x)
calls = 3000


def run(fn):
    for _ in range(300):
        fn()
    sync()
    for key in spent:
        spent[key] = 0.0
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


rows = [{"piece": "bare: forward + backward", "us": run(lambda: Bare.apply(x)[0].backward(grad))},
        {"piece": "bare: forward, grad on", "us": run(lambda: Bare.apply(x))},
        {"piece": "ours: forward, grad on", "us": run(lambda: multi_step("lif", x, tau=2.0, backend=backend))}]
rows.append({"piece": "ours: forward + backward", "us": run(lambda: multi_step("lif", x, tau=2.0, backend=backend)[0].backward(grad))})
rows += [{"piece": f"  inside: {name}", "us": total / calls * 1e6} for name, total in spent.items()]
out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
out.mkdir(parents=True, exist_ok=True)
name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
(out / "backward_parts.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))
for r in rows:
    print(f"{r['piece']:<44} {r['us']:>8.1f}")
