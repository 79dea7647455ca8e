"""The layout the tuner picks for a float32 inference forward (spikes alone). (Its % figure is wrong: the floor
is divided by 1e3 once too often; `short_sweep.py` measures the layouts.)"""
import sys

import torch
from autocuda.runtime.cache import get_plan

from autocuda import benchmark as bench
from autocuda import ops

name, steps, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
bw = bench.copy_bandwidth(clock, True)
case = bench.Case.draw(bench.WORKLOADS[name], torch.float32, steps, n, dev)
fn = bench.call(case, bench.ours(case, final_states=False))
fn()
configs = [e.config for e in ops._REGISTRY.values() if e.config.spec.name == get_plan(name).spec.name]
chosen = [dict(v) for c in configs for k, v in c._tuned.items()]
t = min(clock.median(fn) for _ in range(3))
print(f"{name} ({steps}, {n}): {100 * steps * n * 8 / bw / 1e3 / t:.1f}% {chosen}")
