"""OutlierAwareThresholdNode (K = 6, step mode 'm', float32) on CUDA against SpikingJelly's over 200 seeded inputs of
test_few_spike_gpu.py's shape: the seeds whose outputs differ, where, and the gate there."""
import sys

import spikingjelly.activation_based.neuron.few_spike as sj_few
import torch

import autocuda.nn as our

sys.path.insert(0, "tests/gpu")
from test_few_spike_gpu import K, build  # noqa: E402

CUDA = torch.device("cuda")
theirs = build(sj_few, "OutlierAwareThresholdNode", "m").to(CUDA, torch.float32)
ours = build(our, "OutlierAwareThresholdNode", "m").to(CUDA, torch.float32)
bad = 0
for seed in range(200):
    torch.manual_seed(seed)
    x = torch.randn((K, 64, 129), device=CUDA) * 4
    a, b = theirs(x), ours(x)
    if not torch.equal(a, b):
        bad += 1
        at = (a != b).nonzero()[0].tolist()
        print("seed", seed, "mismatches", int((a != b).sum()), "at", at, "gate", x.sum(0)[at[1], at[2]].item(),
              "theirs", a[tuple(at)].item(), "ours", b[tuple(at)].item())
print("bad seeds", bad, "of 200")
