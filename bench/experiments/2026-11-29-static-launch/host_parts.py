"""Host time of a small LIF call (T=4, N=4096, float32) with and without prepared calls and torch's static
launcher, against the bare autograd.Function of bench/host_floor.py; rows timed in turn, 7 rounds, medians.
Prints a table; writes host_parts.json to the folder given."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from autocuda import prepared  # noqa: E402
from autocuda.functional import multi_step  # noqa: E402
from autocuda.nn import LIFNode  # noqa: E402
from autocuda.runtime import launch  # noqa: E402
from bench.host_floor import Bare  # noqa: E402

x = torch.rand(4, 4096, device="cuda") * 2
xg = x.clone().requires_grad_(True)
grad = torch.ones_like(x)
layer = LIFNode(tau=2.0, step_mode="m")
multi_step("lif", xg, tau=2.0)[0].backward(grad)
static = launch.STATIC_LAUNCHER


def setting(use_prepared, use_static):
    def apply():
        prepared.ENABLED = use_prepared
        launch.STATIC_LAUNCHER = static if use_static else None
    return apply


def infer(fn):
    def call():
        with torch.no_grad():
            fn(x)
    return call


def train(fn):
    return lambda: fn(xg).backward(grad)


def module(u):
    layer.reset()
    return layer(u)


functional = (lambda u: multi_step("lif", u, tau=2.0)[0])
rows = {}
for kind, wrap in (("forward", infer), ("forward+backward", train)):
    rows[(kind, "bare autograd.Function")] = (wrap(lambda u: Bare.apply(u)[0]), setting(True, True))
    rows[(kind, "multi_step")] = (wrap(functional), setting(True, True))
    rows[(kind, "multi_step, full path")] = (wrap(functional), setting(False, True))
    rows[(kind, "multi_step, ctypes launch")] = (wrap(functional), setting(True, False))
    rows[(kind, "multi_step, neither")] = (wrap(functional), setting(False, False))
    rows[(kind, "LIFNode")] = (wrap(module), setting(True, True))
rows[("forward, grad on", "bare autograd.Function")] = (lambda: Bare.apply(xg), setting(True, True))
rows[("forward, grad on", "multi_step")] = (lambda: functional(xg), setting(True, True))
times = {name: [] for name in rows}
for round_ in range(8):
    for name, (call, apply) in rows.items():
        apply()
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            call()
        torch.cuda.synchronize()
        if round_:  # the first round warms up
            times[name].append((time.perf_counter() - t0) / 1000 * 1e6)
setting(True, True)()
result = []
for (kind, system), ts in times.items():
    bare = statistics.median(times[(kind, "bare autograd.Function")])
    result.append({"call": kind, "system": system, "us": statistics.median(ts), "x_bare": statistics.median(ts) / bare})
out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
out.mkdir(parents=True, exist_ok=True)
(out / "host_parts.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                 "static_launcher": static is not None, "rows": result}, indent=1))
print(f"{'call':<18} {'system':<28} {'us/call':>8} {'x bare':>7}")
for r in result:
    print(f"{r['call']:<18} {r['system']:<28} {r['us']:>8.1f} {r['x_bare']:>7.2f}")
