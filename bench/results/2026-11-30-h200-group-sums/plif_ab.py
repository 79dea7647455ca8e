"""ParametricLIF (w shared, learnable) training at (8, 8M): ms per call, in the tree on PYTHONPATH."""
import torch

from autocuda.spec.load import load_spec
from bench.measure import Clock
from bench.noise import layer_call

clock = Clock(torch.device("cuda"), False)
for dt in (torch.float32, torch.bfloat16):
    print("plif", dt, round(clock.median(layer_call(load_spec("parametric_lif"), dt, 8, 8 << 20, True)), 4), flush=True)
