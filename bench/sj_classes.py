"""SpikingJelly 2.0's newer neuron classes against ours, one training step each (forward and backward; STBIF, which
trains neither, a forward), at (T, N) = (8, 8M) by default, in float32 and bfloat16, on one GPU, in one run:
`python -m bench.sj_classes [--device cuda] [--steps 8] [--neurons 8388608] [--reps 20]`. Each class is built
the same way in both libraries (its arguments, parameters copied from SpikingJelly's layer); the table gives the
median time of each and SpikingJelly's over ours. `--device cpu --neurons 4096 --reps 2` runs the logic only."""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import autocuda.nn as our

CHANNELS = 64  # the per-channel classes' inputs are [T, B, C, H, W] with C = 64 and H = W (BatchNorm2d, GLIF)


def _classes(steps: int) -> dict[str, tuple[Callable[[Any], torch.nn.Module], bool, bool]]:
    """name -> (build(module of classes), trains, takes [T, B, C, H, W])."""
    return {
        "DSRIFNode": (lambda m: m.DSRIFNode(T=steps, v_threshold=1.0), True, False),
        "DSRLIFNode": (lambda m: m.DSRLIFNode(T=steps), True, False),
        "STBIFNode": (lambda m: m.STBIFNode(0.5, 8, sym=True, step_mode="m"), False, False),
        "ActivationAwareIFNode": (lambda m: m.ActivationAwareIFNode(0.75, 0.25, step_mode="m"), True, False),
        "MPBNLIFNode": (lambda m: m.MPBNLIFNode(out_channels=CHANNELS, step_mode="m"), True, True),
        "GatedLIFNode": (lambda m: m.GatedLIFNode(T=steps, inplane=CHANNELS), True, True),
    }


def _input(steps: int, neurons: int, channels: bool, dtype: torch.dtype, device: str) -> torch.Tensor:
    if channels:
        side = max(1, int((neurons // (CHANNELS * 32)) ** 0.5))
        shape: tuple[int, ...] = (steps, 32, CHANNELS, side, side)
    else:
        shape = (steps, neurons)
    return (torch.randn(shape, device=device) + 0.5).to(dtype)


def _time(layer: torch.nn.Module, x: torch.Tensor, trains: bool, reps: int, device: str) -> float:
    """The median seconds of one call (and its backward, where the class trains), after a warm-up."""
    def call() -> None:
        if hasattr(layer, "reset"):
            layer.reset()
        if trains:
            layer(x.requires_grad_(True)).sum().backward()
        else:
            with torch.no_grad():
                layer(x)

    times = []
    for rep in range(reps + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        if rep >= 2:  # the first two compile and allocate
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(steps: int, neurons: int, reps: int, device: str, dtypes: list[str]) -> list[tuple[str, str, float, float]]:
    from spikingjelly.activation_based import neuron as theirs

    rows = []
    for name, (build, trains, channels) in _classes(steps).items():
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            np.random.seed(0)
            sj_layer = build(theirs).to(device, dtype)
            np.random.seed(0)
            our_layer = build(our).to(device, dtype)
            our_layer.load_state_dict(sj_layer.state_dict())
            x = _input(steps, neurons, channels, dtype, device)
            rows.append((name, dtype_name, _time(sj_layer, x, trains, reps, device),
                         _time(our_layer, x, trains, reps, device)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--neurons", type=int, default=8 << 20)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args(argv)
    print(f"{'class':24} {'dtype':9} {'SpikingJelly ms':>16} {'autocuda ms':>12} {'speed-up':>9}")
    for name, dtype, sj_time, our_time in run(args.steps, args.neurons, args.reps, args.device,
                                              args.dtypes.split(",")):
        print(f"{name:24} {dtype:9} {sj_time * 1e3:16.3f} {our_time * 1e3:12.3f} {sj_time / our_time:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
