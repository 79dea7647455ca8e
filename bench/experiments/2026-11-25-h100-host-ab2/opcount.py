import sys
sys.path.insert(0, sys.argv[1])
import torch
from autocuda.nn import LIFNode
from autocuda import functional as F
from autocuda.spec.load import load_spec
from autocuda.surrogate import Sigmoid
x = torch.rand(4, 64) * 2
xg = x.clone().requires_grad_()
node = LIFNode(step_mode="m", backend="host")
spec, sg = load_spec("lif"), Sigmoid(alpha=4.0)
def mod():
    node.reset(); node(x)
def fun():
    F.multi_step(spec, x, 0.0, surrogate=sg, backend="host", tau=2.0, v_threshold=1.0, v_reset=0.0)
def train():
    node.reset(); node(xg).sum().backward()
out = []
for name, fn, grad in (("module inference", mod, False), ("functional inference", fun, False), ("module training", train, True)):
    with torch.set_grad_enabled(grad):
        for _ in range(3): fn()
        count = {"ops": 0, "calls": 0}
        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            if event == "call": count["calls"] += 1
            if event == "opcode": count["ops"] += 1
            return tracer
        sys.settrace(tracer); fn(); sys.settrace(None)
    out.append(f"{name}: {count['ops']} bytecodes, {count['calls']} Python calls")
print(sys.argv[1], "|", "; ".join(out))
