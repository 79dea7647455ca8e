"""Cold tuning: which path's first (tuning) call differs from a later call of the same configuration?"""
import importlib.util
import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("rel", root / "tests/gpu/test_reliability_gpu.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)


def diff(a, b):
    return [(i, int((x != y).sum()), bool(torch.isnan(x).any())) for i, (x, y) in enumerate(zip(a, b))]


order = sys.argv[1]
runs = {}
for path in order.split(","):
    if path == "fast":
        runs.setdefault("fast", []).append(rel._training_step("parametric_lif", torch.float32))
    else:
        with rel._deterministic():
            runs.setdefault("exact", []).append(rel._training_step("parametric_lif", torch.float32))
for name, got in runs.items():
    print(order, name, "first vs later:", diff(got[0], got[-1]))
if len(runs) == 2:
    print(order, "fast vs exact (later runs):", diff(runs["fast"][-1][:-1], runs["exact"][-1][:-1]))
