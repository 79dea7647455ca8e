"""Which layout makes the per-channel training step differ from the deterministic path (tests/gpu/
test_reliability_gpu.py): every short-loop candidate forced on both paths through `_layout`."""
import importlib.util
from pathlib import Path

import torch

from autocuda.layout import Layout
from autocuda.runtime import neuron_launch, tuning

root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("rel", root / "tests/gpu/test_reliability_gpu.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)

original = neuron_launch._layout
n = 2 * 4 * 65536
for dtype in (torch.float32, torch.float16):
    layouts = [None, *tuning.candidates(n, dtype, lambda width: True, long=False)]
    for layout in layouts:
        if layout is not None:
            forced = Layout.of(layout)
            neuron_launch._layout = lambda *a, **k: forced
        else:
            neuron_launch._layout = original
        fast = rel._training_step("parametric_lif", dtype)
        with rel._deterministic():
            exact = rel._training_step("parametric_lif", dtype)
        same = [torch.equal(a, b) for a, b in zip(fast[:-1], exact[:-1])]
        worst = [float((a.double() - b.double()).abs().max()) for a, b in zip(fast[:-1], exact[:-1])]
        print(dtype, layout, same, worst)
neuron_launch._layout = original
