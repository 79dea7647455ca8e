# ruff: noqa: B023  (the step functions run within the iteration that defines them)
"""Mixing kernels with one neuron a thread against two (forward; fused and deterministic backward), one process,
configurations interleaved, steps queued behind a wait. PSN(8) at (8, 8M)."""
import torch

import autocuda.codegen.mixing_kernel as mk
from autocuda.call import mixing
from autocuda.nn import PSN

T, N = 8, 8 * 1024 * 1024
original_kernels, original_lanes = mk.mixing_kernels, mixing.word_lanes


def configure(forward_lanes, fused_lanes):
    mixing.word_lanes = lambda rows: forward_lanes if original_lanes(rows) == 2 else 1

    def kernels(steps, dtype, surrogate, lanes=1):
        f, b, _ = original_kernels(steps, dtype, surrogate, lanes)
        return f, b, original_kernels(steps, dtype, surrogate, fused_lanes if lanes == 2 else 1)[2]
    mk.mixing_kernels = kernels


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


for dtype in (torch.bfloat16, torch.float32):
    torch.manual_seed(0)
    layer = PSN(T).cuda()
    x = torch.randn(T, N, device="cuda", dtype=dtype).requires_grad_()
    g = torch.randn(T, N, device="cuda", dtype=dtype)
    results = {}
    for config in [(1, 1), (2, 1), (2, 2)]:
        configure(*config)
        out = layer(x)
        gx, gw, gb = torch.autograd.grad(out, (x, layer.weight, layer.bias), g)
        results[config] = (out, gx, gw, gb)
    base = results[(1, 1)]
    for config, r in results.items():
        print(dtype, config, "spikes equal", torch.equal(r[0], base[0]), "grad_x equal", torch.equal(r[1], base[1]),
              "grad_w rel", float((r[2] - base[2]).norm() / base[2].norm()), flush=True)

    def fwd():
        with torch.no_grad():
            layer(x)

    def train():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()

    def train_deterministic():
        torch.use_deterministic_algorithms(True)
        try:
            train()
        finally:
            torch.use_deterministic_algorithms(False)

    rows = {}
    for _ in range(3):
        for config in [(1, 1), (2, 1), (2, 2)]:
            configure(*config)
            for name, step in (("forward", fwd), ("train fused", train), ("train deterministic", train_deterministic)):
                if name != "train fused" and config == (2, 2):
                    continue
                rows.setdefault((name, config), []).append(timed(step))
    for (name, config), times in rows.items():
        print(f"{str(dtype):15} {name:20} lanes fwd/fused {config}: min {min(times):.4f} ms  all "
              + " ".join(f"{t:.4f}" for t in times), flush=True)
