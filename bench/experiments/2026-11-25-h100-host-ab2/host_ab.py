"""Host time per call of one tree (sys.argv[1] on sys.path): LIF T=4 N=4096 fp32, module and functional,
inference and training; 15 rounds of 1000 calls after a warm-up; prints one JSON line (min and median per call)."""
import json
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402

from autocuda import functional as F  # noqa: E402
from autocuda.nn import LIFNode  # noqa: E402
from autocuda.spec.load import load_spec  # noqa: E402
from autocuda.surrogate import Sigmoid  # noqa: E402

torch.manual_seed(0)
x = torch.rand(4, 4096, device="cuda") * 2
xg = x.clone().requires_grad_()
spec, sg = load_spec("lif"), Sigmoid(alpha=4.0)
node = LIFNode(step_mode="m").cuda()


def module_inference():
    node.reset()
    node(x)


def functional_inference():
    F.multi_step(spec, x, 0.0, surrogate=sg, tau=2.0, v_threshold=1.0, v_reset=0.0)


def module_training():
    node.reset()
    node(xg).sum().backward()


CASES = {"module inference": (module_inference, True), "functional inference": (functional_inference, True),
         "module training": (module_training, False)}
out = {}
for name, (fn, no_grad) in CASES.items():
    with torch.no_grad() if no_grad else torch.enable_grad():
        calls = 1000 if no_grad else 300
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        rounds = []
        for _ in range(15):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            rounds.append((time.perf_counter() - t) / calls * 1e6)
    out[name] = {"min": min(rounds), "median": statistics.median(rounds)}
print(json.dumps({"tree": sys.argv[2], **out}))
