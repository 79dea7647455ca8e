"""The spiking VGG (bench/network.py) at T=4, B=64, float32, for the given systems, with the fused BatchNorm's
statistics computed as they are (argv[1] = "varmean": torch.var_mean, one Welford pass) or in two passes
("twopass": the mean, then the mean of squared deviations), to see whether the fused model compiles with
mode="reduce-overhead" (it failed in Triton on Inductor's var_mean kernel on 2026-11-26) and how fast it runs.

    python fused_ro.py VARIANT SYSTEMS [SHAPES] [PRECISIONS]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import network  # noqa: E402

from autocuda.nn import batchnorm  # noqa: E402

LOW = (torch.float16, torch.bfloat16)


def two_pass(ctx, x, channel, count):
    dims = [d for d in range(x.dim()) if d != channel]
    wide = x.float() if x.dtype in LOW else x
    mean = wide.mean(dim=dims, keepdim=True)
    var = (wide - mean).square().mean(dim=dims)
    mean = mean.reshape(-1)
    ctx.save_for_backward(x, mean)
    ctx.channel, ctx.count = channel, count
    return mean, var


if sys.argv[1] == "twopass":
    batchnorm._Statistics.forward = staticmethod(two_pass)
shapes = [tuple(map(int, s.split("x"))) for s in (sys.argv[3] if len(sys.argv) > 3 else "4x64").split(",")]
precisions = (sys.argv[4] if len(sys.argv) > 4 else "float32").split(",")
rows = network.measure_all(sys.argv[2].split(","), shapes, precisions, 20, torch.device("cuda"))
for row in rows:
    print(sys.argv[1], row, flush=True)
