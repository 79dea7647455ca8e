"""Cold tuning (fresh AUTOCUDA_CACHE_DIR): does the per-channel step then differ from the deterministic path,
and which layouts did each configuration's kernels get? Then every (forward layout, backward layout) pair."""
import importlib.util
import itertools
import sys
from pathlib import Path

import torch

from autocuda.layout import Layout
from autocuda.runtime import neuron_launch, tuning

root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("rel", root / "tests/gpu/test_reliability_gpu.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)

chosen = []
original_fastest = tuning.fastest


def recording(text, device, layouts, run):
    best = original_fastest(text, device, layouts, run)
    chosen.append((text[:120], best))
    return best


tuning.fastest = recording


def compare(label):
    fast = rel._training_step("parametric_lif", torch.float32)
    with rel._deterministic():
        exact = rel._training_step("parametric_lif", torch.float32)
    print(label, [(i, int((a != b).sum())) for i, (a, b) in enumerate(zip(fast[:-1], exact[:-1]))], flush=True)


compare("cold")
for text, best in chosen:
    print("   tuned", best, text)
if len(sys.argv) > 1:
    original = neuron_launch._layout
    n = 2 * 4 * 65536
    layouts = [Layout.of(c) for c in tuning.candidates(n, torch.float32, lambda width: True, long=False)]
    for fwd, bwd in itertools.product(layouts, layouts):
        neuron_launch._layout = lambda config, kind, *a, f=fwd, b=bwd: f if kind == "fptt" else b
        compare(f"fwd {fwd.options()} bwd {bwd.options()}")
    neuron_launch._layout = original
