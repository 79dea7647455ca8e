"""Do backward layouts give bitwise the same results? The reliability test's training step (per-neuron path)
with each short-loop candidate forced on backward (forward fixed), compared with the first."""
import importlib.util
import sys
from pathlib import Path

import torch

from autocuda.runtime import compile as compile_stage

if "fmad" in sys.argv[1:]:
    compile_stage.NVRTC_OPTIONS = (*compile_stage.NVRTC_OPTIONS, "--fmad=false")

from autocuda.layout import Layout
from autocuda.runtime import neuron_launch, tuning

root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("rel", root / "tests/gpu/test_reliability_gpu.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)

n = 2 * 4 * 65536
for name in ("parametric_lif", "alif"):
    for dtype in (torch.float32, torch.float16):
        layouts = [Layout.of(c) for c in tuning.candidates(n, dtype, lambda width: True, long=False)]
        for side in ("fptt", "bptt"):
            results = []
            for layout in layouts:
                def chosen(config, kind, *a, forced=layout, side=side):
                    return forced if kind == side else layouts[0]
                neuron_launch._layout = chosen
                with rel._deterministic():
                    results.append(rel._training_step(name, dtype))
            for layout, got in zip(layouts, results):
                print(sys.argv[1:], name, dtype, side, layout.options(),
                      [int((a != b).sum()) for a, b in zip(got, results[0])], flush=True)
