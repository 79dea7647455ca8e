"""Where host time goes: cProfile of our LIF call (inference, training) and torch.profiler of the spiking VGG step,
ours eager vs ours under torch.compile (default mode), T=4 B=64 float32. Prints tables; writes to --out."""
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def cprofile(name, call, n=5000):
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    text = f"== {name}: {us:.1f} us/call unprofiled\n" + s.getvalue()
    (out / f"cprofile_{name}.txt").write_text(text)
    print(text[:6000])


from autocuda.functional import multi_step  # noqa: E402
from autocuda.nn import LIFNode  # noqa: E402

x = torch.rand(4, 4096, device="cuda") * 2
xg = x.clone().requires_grad_(True)
g = torch.ones_like(x)
layer = LIFNode(tau=2.0, step_mode="m")


def inf():
    with torch.no_grad():
        multi_step("lif", x, tau=2.0)


def mod():
    layer.reset()
    with torch.no_grad():
        layer(x)


def train():
    multi_step("lif", xg, tau=2.0)[0].backward(g)


def empty3():
    with torch.no_grad():
        torch.empty_like(x), torch.empty_like(x), x.new_empty(4096)


cprofile("empty3", empty3)
cprofile("functional_inference", inf)
cprofile("module_inference", mod)
cprofile("functional_training", train, 2000)

from bench import network  # noqa: E402
from torch import nn  # noqa: E402

for system in ("ours", "ours-compiled", "ours-fused", "loop-compiled"):
    torch.manual_seed(0)
    model = network.build(system, torch.device("cuda"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = torch.rand(4, 64, 3, 32, 32, device="cuda")
    target = torch.randint(0, 10, (64,), device="cuda")

    def step():
        network._reset(model)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xs), target)
        loss.backward()
        opt.step()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 20 * 1e3
    from torch._dynamo.utils import counters
    breaks = dict(counters["graph_break"])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    p.export_chrome_trace(str(out / f"trace_{system}.json"))
    table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    gtable = p.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
    text = f"== {system}: {ms:.2f} ms/step wall; graph breaks {breaks}\n{table}\n{gtable}"
    (out / f"profile_{system}.txt").write_text(text)
    print(text[:9000])
    counters.clear()
