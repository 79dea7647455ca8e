"""The reliability test's per-channel comparison repeated in one process, reporting what differs."""
import importlib.util
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("rel", root / "tests/gpu/test_reliability_gpu.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)

for dtype in (torch.float32, torch.float16, torch.float32):
    for attempt in range(3):
        fast = rel._training_step("parametric_lif", dtype)
        with rel._deterministic():
            exact = rel._training_step("parametric_lif", dtype)
        again = rel._training_step("parametric_lif", dtype)
        rows = []
        for i, (a, b, c) in enumerate(zip(fast[:-1], exact[:-1], again[:-1])):
            rows.append((i, int((a != b).sum()), float((a.double() - b.double()).abs().max()), int((a != c).sum())))
        print(dtype, attempt, rows, flush=True)
