"""Host time of PLIF against LIF layer calls on the host runner through the native path: a reset and a call
(inference), and a call with backward (training), tiny shapes; how many calls take the keyed call."""
import time

import torch

from autocuda import nn
from autocuda.call import native, program

assert native.ensure()
native.USE = True
native.HOST = True
torch.set_num_threads(1)
x = torch.rand(2, 4) * 2
xg = x.clone().requires_grad_()
layers = {"plif": nn.ParametricLIFNode(step_mode="m", backend="host"),
          "lif": nn.LIFNode(step_mode="m", backend="host")}
keyed = []
original = program.Program.run_layer


def spy(self, *args, **kwargs):
    results = original(self, *args, **kwargs)
    keyed.append(bool(results))
    return results


program.Program.run_layer = spy


def infer(layer):
    def call():
        layer.reset()
        with torch.no_grad():
            layer(x)
    return call


def train(layer):
    def call():
        layer.reset()
        layer(xg).sum().backward()
    return call


def run(fn, n=3000):
    for _ in range(200):
        fn()
    keyed.clear()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6, sum(keyed)


for name, layer in layers.items():
    for mode, make in (("inference", infer), ("training", train)):
        best = min(run(make(layer)) for _ in range(3))
        print(name, mode, f"{best[0]:.1f} us", "keyed calls", best[1])
