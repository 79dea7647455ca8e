"""Where a compiled step's host time goes (cProfile of 20 steps), the copies around our ops in inductor's code,
and step times of eager / compiled (default) / compiled (reduce-overhead) / plain loop compiled."""
import cProfile
import io
import logging
import pstats
import sys
import time

import torch

sys.path.append(".")
from bench.network import LoopLIF, SpikingVGG, _ours, _reset  # noqa: E402

T, B = (int(v) for v in sys.argv[1].split("x"))
device = torch.device("cuda")
torch.manual_seed(0)
x = torch.rand(T, B, 3, 32, 32, device=device)
target = torch.randint(0, 10, (B,), device=device)


def make(neuron, mode):
    model = SpikingVGG(neuron).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = model if mode == "eager" else torch.compile(model, mode=mode)

    def step():
        _reset(model)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(run(x), target).backward()
        opt.step()
    return step


def wall(step, n=30):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


if sys.argv[2] == "code":
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    torch._logging.set_logs(output_code=True)
    logging.getLogger("torch._inductor").addHandler(handler)
    step = make(_ours, "default")
    step()
    torch.cuda.synchronize()
    text = stream.getvalue()
    open(sys.argv[3], "w").write(text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "neuron_forward" in line or "neuron_backward" in line or "copy_" in line or "as_strided" in line:
            print(f"{i}: {line.strip()[:220]}")
    sys.exit()

if sys.argv[2] == "profile":
    step = make(_ours, "default")
    wall(step)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(35)
    print(out.getvalue()[-9000:])
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
    print(out.getvalue()[-9000:])
    sys.exit()

CONFIGS = (("ours eager", _ours, "eager"), ("ours compiled", _ours, "default"),
           ("ours compiled reduce-overhead", _ours, "reduce-overhead"), ("loop compiled", LoopLIF, "default"))
for name, neuron, mode in CONFIGS[:2] if sys.argv[2] == "ours" else CONFIGS:
    torch._dynamo.reset()
    t0 = time.perf_counter()
    step = make(neuron, mode)
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    print(f"{name:<32} {wall(step):7.2f} ms per step (first step {first:.1f} s)", flush=True)
