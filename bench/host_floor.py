"""Host time of our neuron call against torch's own floor: a bare `torch.autograd.Function` that only allocates
what our LIF op allocates (forward: the spikes, h for backward and the final membrane; backward: the input's
gradient), on the same shapes, in the same process.

    python -m bench.host_floor --out DIR [--steps 4] [--neurons 4096] [--calls 2000] [--repeats 7] [--device cuda]

Rows: forward (inference: no gradient) and forward+backward (a training call, `backward` of the spikes), for the
bare function, our `LIFNode` (multi-step module) and our functional `multi_step`. Time per call is the wall time
of `calls` calls (the small kernels keep the device idle: the host is what is timed), the median of `repeats`
rounds; each round times the systems in turn, and a row's ratio is the median of its rounds' ratios.
Targets (issue 28): ours <= 1.5x the bare forward, <= 1.3x the bare forward+backward.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


class Bare(torch.autograd.Function):
    """Allocates the outputs of our LIF forward (spikes and h [T, N], the final membrane [N]) and, backward, the
    input's gradient: torch's floor for an autograd op of this shape."""

    @staticmethod
    def forward(ctx, x):
        h = torch.empty_like(x)
        ctx.save_for_backward(h)
        return torch.empty_like(x), x.new_empty(x.shape[-1])

    @staticmethod
    def backward(ctx, grad_spikes, grad_final):
        (h,) = ctx.saved_tensors
        return torch.empty_like(h)


def interleaved_us(calls_by_system: dict[str, Callable[[], object]], calls: int, repeats: int,
                   sync: Callable[[], None]) -> dict[str, list[float]]:
    """µs per call of each system, `repeats` rounds; each round times every system in turn, so that a host whose
    speed drifts (other tenants, clocks) shifts every system of a round alike and the ratios of one round hold."""
    for call in calls_by_system.values():
        for _ in range(max(10, calls // 10)):
            call()
    sync()
    times: dict[str, list[float]] = {system: [] for system in calls_by_system}
    for _ in range(repeats):
        for system, call in calls_by_system.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            sync()
            times[system].append((time.perf_counter() - t0) / calls * 1e6)
    return times


def measure(steps: int, neurons: int, calls: int, repeats: int, device: torch.device) -> list[dict]:
    from autocuda.call import native
    from autocuda.call.functional import multi_step
    from autocuda.nn import LIFNode

    native.ensure()  # loaded (or built) before timing; AUTOCUDA_NATIVE=1 times the native path, else the Python path

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.rand(steps, neurons, device=device) * 2
    xg = x.clone().requires_grad_(True)
    grad = torch.ones_like(x)
    layer = LIFNode(tau=2.0, step_mode="m")

    def module(inp: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(inp)

    def functional(inp: torch.Tensor) -> torch.Tensor:
        return multi_step("lif", inp, tau=2.0)[0]

    def bare(inp: torch.Tensor) -> torch.Tensor:
        return Bare.apply(inp)[0]

    systems = (("bare autograd.Function", bare), ("ours LIFNode", module), ("ours multi_step", functional))
    rows = []
    for kind, train in (("forward", False), ("forward+backward", True)):
        calls_by_system = {}
        for system, fn in systems:
            if train:
                def call(fn=fn):
                    fn(xg).backward(grad)
            else:
                def call(fn=fn):
                    with torch.no_grad():
                        fn(x)
            calls_by_system[system] = call
        times = interleaved_us(calls_by_system, calls, repeats, sync)
        floor = times[systems[0][0]]
        for system, _ in systems:
            ratios = [t / f for t, f in zip(times[system], floor)]
            rows.append({"call": kind, "system": system, "us": statistics.median(times[system]),
                         "ratio": statistics.median(ratios), "ratios": ratios})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'call':<17} {'system':<24} {'us/call':>8} {'x bare':>7}"]
    lines += [f"{r['call']:<17} {r['system']:<24} {r['us']:>8.1f} {r['ratio']:>7.2f}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for host_floor.json and host_floor.txt")
    parser.add_argument("--steps", type=int, default=4, help="T (default 4)")
    parser.add_argument("--neurons", type=int, default=4096, help="N (default 4096)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing (default 2000)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds, the median kept (default 7)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test: the host runner)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = measure(args.steps, args.neurons, args.calls, args.repeats, device)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    shape = {"T": args.steps, "N": args.neurons}
    from autocuda.call import native

    path = f"{'on' if native.USE else 'off'} (library {native.status()})"
    (args.out / "host_floor.json").write_text(json.dumps({"device": name, **shape, "native": path, "rows": rows},
                                                         indent=1))
    table = f"native call path: {path}\n" + format_table(rows)
    (args.out / "host_floor.txt").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
