"""Host-bound compiled training steps: the ops' implementations by native plans (native.USE on) against the Python
launch (off), toggled in one process, order rotated; and the VGG-like small net. Prints a table, writes JSON."""
import json, statistics, sys, time, torch
import autocuda
from autocuda import nn as ann
from autocuda.call import native
torch.manual_seed(0)
dev = "cuda"
native.ensure()

def mlp(width, layers):
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), ann.LIFNode(step_mode="m")]
    return torch.nn.Sequential(*mods).to(dev)

class TimeDistributed(torch.nn.Module):
    def __init__(self, net): super().__init__(); self.net = net
    def forward(self, x): return self.net(x)

results = {}
for (T, B, W, L, dtype) in [(4, 16, 256, 2, torch.float32), (4, 16, 256, 4, torch.float32), (4, 64, 512, 4, torch.bfloat16)]:
    net = mlp(W, L)
    x = torch.rand(T, B, W, device=dev)
    compiled = torch.compile(net)
    def step():
        for m in net:
            if hasattr(m, "reset"): m.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = compiled(x)
        out.float().sum().backward()
    def timed(n=200):
        for _ in range(20): step()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): step()
        torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
    for on in (True, False):
        native.USE = on
        for _ in range(30): step()
    res = {True: [], False: []}
    for r in range(8):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            native.USE = on
            res[on].append(timed())
    name = f"T={T} B={B} width={W} layers={L} {str(dtype).split('.')[-1]}"
    results[name] = {"native_us": statistics.median(res[True]), "python_us": statistics.median(res[False])}
    r = results[name]
    print(f"{name:45s} native {r['native_us']:8.1f} us  python {r['python_us']:8.1f} us  ratio {r['native_us']/r['python_us']:.3f}", flush=True)
    native.USE = True
if len(sys.argv) > 1:
    json.dump(results, open(sys.argv[1], "w"), indent=1)
