"""GPU kernel time per SGD step of bench/network.py's spiking VGG (T=4, B=64, float32), by kernel, for the given
systems: where does the fused BatchNorm model's GPU time go, against the unfused one?

    python profile.py SYSTEMS [TxB] [PRECISION]
"""
import collections
import os
import contextlib
import sys
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import network  # noqa: E402

STEPS = 5
if os.environ.get("LAYOUT_OPT") == "0":
    import torch._inductor.config

    torch._inductor.config.layout_optimization = False


def kind(name: str) -> str:
    low = name.lower()
    if low.startswith("lif_"):
        return "ours"
    for key, label in (("autocuda", "ours"), ("ac_", "ours"), ("triton", "triton"), ("conv", "conv"),
                       ("cudnn", "conv"), ("gemm", "gemm"), ("bn_", "bn"), ("batch_norm", "bn"),
                       ("welford", "bn"), ("reduce", "reduce"), ("elementwise", "elementwise"),
                       ("pool", "pool"), ("copy", "copy")):
        if key in low:
            return label
    return "other"


def run(system: str, T: int, B: int, precision: str) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = network.build(system, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    target = torch.randint(0, 10, (B,), device=device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16"
                else contextlib.nullcontext())

    def step():
        if network.mode_of(system) == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        network._reset(model)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()

    for _ in range(6):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    by_name: dict = collections.Counter()
    count: dict = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            count[event.name] += 1
    total = sum(by_name.values()) / STEPS
    kinds: dict = collections.Counter()
    for name, us in by_name.items():
        kinds[kind(name)] += us / STEPS
    print(f"\n== {system} T={T} B={B} {precision}: GPU kernel time {total / 1e3:.3f} ms/step, "
          f"{sum(count.values()) / STEPS:.0f} kernels/step")
    print("   by kind: " + ", ".join(f"{k} {v / 1e3:.3f}" for k, v in kinds.most_common()))
    for name, us in by_name.most_common(22):
        print(f"   {us / STEPS:8.1f} us  x{count[name] / STEPS:4.1f}  {name[:110]}")
    torch._dynamo.reset()


T, B = map(int, (sys.argv[2] if len(sys.argv) > 2 else "4x64").split("x"))
for system in sys.argv[1].split(","):
    try:
        run(system, T, B, sys.argv[3] if len(sys.argv) > 3 else "float32")
    except Exception as error:
        print(system, "failed", type(error).__name__, str(error)[-400:])
