"""Host time per eager call (no sync inside the loop) of STBIF, LIF, PLIF at (8, 4096) fp32 on CUDA; cProfile STBIF."""
import sys, time, cProfile, pstats, io, torch
import autocuda.nn as our
def per_call(layer, x, n=3000, grad=False):
    for _ in range(100):
        layer.reset(); y = layer(x)
        if grad: y.sum().backward()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        layer.reset(); y = layer(x)
        if grad: y.sum().backward()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
x = torch.rand(8, 4096, device="cuda") * 2
layers = {"STBIF": our.STBIFNode(0.5, 8, sym=True, step_mode="m").cuda(),
          "LIF": our.LIFNode(step_mode="m").cuda(), "PLIF": our.ParametricLIFNode(step_mode="m").cuda(),
          "IF": our.IFNode(step_mode="m").cuda()}
with torch.no_grad():
    for name, layer in layers.items():
        print(f"{name} no-grad: {per_call(layer, x):.1f} us/call")
for name in ("LIF", "PLIF"):
    print(f"{name} train: {per_call(layers[name], x.clone().requires_grad_(), 1000, True):.1f} us/call")
if len(sys.argv) > 1 and sys.argv[1] == "quick":
    sys.exit(0)
with torch.no_grad():
    pr = cProfile.Profile(); pr.enable(); per_call(layers["STBIF"], x, 2000); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:6000])
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30); print(s.getvalue()[:6000])
pr = cProfile.Profile(); pr.enable(); per_call(layers["PLIF"], x.clone().requires_grad_(), 1000, True); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue()[:8000])
