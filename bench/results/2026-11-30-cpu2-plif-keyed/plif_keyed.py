"""Host time of PLIF against LIF layer calls on the host runner through the native path: a reset and a call
(inference), and a call with backward (training), tiny shapes; how many calls take the keyed call."""
import sys, time, torch
from autocuda import nn
from autocuda.call import native, program
assert native.ensure()
native.USE = True; native.HOST = True
torch.set_num_threads(1)
x = torch.rand(2, 4) * 2
xg = x.clone().requires_grad_()
layers = {"plif": nn.ParametricLIFNode(step_mode="m", backend="host"), "lif": nn.LIFNode(step_mode="m", backend="host")}
keyed = []
orig = program.Program.run_layer
def spy(self, *a, **k):
    r = orig(self, *a, **k); keyed.append(bool(r)); return r
program.Program.run_layer = spy
def infer(layer):
    def f():
        layer.reset()
        with torch.no_grad():
            layer(x)
    return f
def train(layer):
    def f():
        layer.reset(); layer(xg).sum().backward()
    return f
def run(fn, n=3000):
    for _ in range(200): fn()
    keyed.clear()
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n * 1e6, sum(keyed)
for name, layer in layers.items():
    for mode, make in (("inference", infer), ("training", train)):
        best = min(run(make(layer)) for _ in range(3))
        print(name, mode, f"{best[0]:.1f} us", "keyed calls", best[1])
