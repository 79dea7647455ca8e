import sys, cProfile, pstats, io, time
sys.path.insert(0, sys.argv[1])
import torch
from autocuda import functional as F
from autocuda.spec.load import load_spec
from autocuda.surrogate import Sigmoid
x = torch.rand(4, 4096, device="cuda") * 2
spec, sg = load_spec("lif"), Sigmoid(alpha=4.0)
params = dict(tau=2.0, v_threshold=1.0, v_reset=0.0)
def fwd():
    F.multi_step(spec, x, 0.0, surrogate=sg, **params)
with torch.no_grad():
    for _ in range(200): fwd()
    torch.cuda.synchronize()
    best = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(2000): fwd()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t) / 2000 * 1e6)
    print(sys.argv[1], "us per call", " ".join(f"{b:.1f}" for b in sorted(best)))
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): fwd()
    pr.disable()
s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(18)
for line in s.getvalue().splitlines():
    if "function calls" in line or "/" in line or "{" in line: print(line[:150].replace(sys.argv[1] + "/", ""))
