"""Host time per eager multi-step call (no synchronisation inside the timed loop) of STBIF, LIF, PLIF and IF at
T = 8, N = 4096, float32, on CUDA; without `quick`, cProfile tables of STBIF (no grad) and PLIF (training) after.
Run from a tree's root with that tree on PYTHONPATH."""
import cProfile
import io
import pstats
import sys
import time

import torch

import autocuda.nn as our


def per_call(layer: torch.nn.Module, x: torch.Tensor, n: int = 3000, grad: bool = False) -> float:
    """Microseconds per call (each after a reset; with `grad`, its backward too), after 100 untimed calls."""
    for rep in range(100 + n):
        if rep == 100:
            torch.cuda.synchronize()
            start = time.perf_counter()
        layer.reset()
        y = layer(x)
        if grad:
            y.sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def profiled(layer: torch.nn.Module, x: torch.Tensor, n: int, grad: bool, rows: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    per_call(layer, x, n, grad)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def main() -> None:
    x = torch.rand(8, 4096, device="cuda") * 2
    layers = {"STBIF": our.STBIFNode(0.5, 8, sym=True, step_mode="m").cuda(),
              "LIF": our.LIFNode(step_mode="m").cuda(), "PLIF": our.ParametricLIFNode(step_mode="m").cuda(),
              "IF": our.IFNode(step_mode="m").cuda()}
    with torch.no_grad():
        for name, layer in layers.items():
            print(f"{name} no-grad: {per_call(layer, x):.1f} us/call")
    for name in ("LIF", "PLIF"):
        print(f"{name} train: {per_call(layers[name], x.clone().requires_grad_(), 1000, True):.1f} us/call")
    if sys.argv[1:] == ["quick"]:
        return
    with torch.no_grad():
        print(profiled(layers["STBIF"], x, 2000, False, 30))
    print(profiled(layers["PLIF"], x.clone().requires_grad_(), 1000, True, 40))


if __name__ == "__main__":
    main()
