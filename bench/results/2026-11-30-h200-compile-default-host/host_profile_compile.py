"""Host profile of compiled (default mode) VGG steps, T=4 B=64: Dynamo's counters after warm-up, the step time, and
cProfile's top functions over 20 steps. `python host_profile_compile.py > hostprof.txt` from the repository root."""
import contextlib
import cProfile
import io
import pstats
import time

import torch
import torch._dynamo.utils as dynamo_utils
from torch import nn

from bench import network

T, B = 4, 64
ROWS = (("ours-compiled-cl", "bfloat16"), ("ours-compiled-cl", "float32"), ("loop-compiled-cl", "bfloat16"))


def run(system: str, precision: str) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    dynamo_utils.counters.clear()
    model = network.build(system, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    if system.endswith("-cl"):
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    target = torch.randint(0, 10, (B,), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16" else contextlib.nullcontext()

    def step() -> None:
        network._reset(model)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    counted = {k: dict(v) for k, v in dynamo_utils.counters.items() if k in ("stats", "graph_break", "recompiles",
                                                                             "frames")}
    print("==", system, precision, counted, flush=True)
    start = time.perf_counter()
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    print("step ms", (time.perf_counter() - start) / 30 * 1e3)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    for order, rows, chars in (("tottime", 30, 6000), ("cumtime", 45, 8000)):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        print(text.getvalue()[:chars])


for system, precision in ROWS:
    run(system, precision)
