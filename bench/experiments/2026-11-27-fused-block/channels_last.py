"""Channels-last spiking VGG (bench/network.py) at T=4, B=64: the model's parameters and input in
torch.channels_last, and our LIF run on the [T, B, H, W, C] view of the convolution's output (a permute, no copy),
against the plain loop on the same layout. Prints GPU kernel time per step and step time.

    LAYOUT_OPT=0|1 python channels_last.py SYSTEMS [PRECISION]
"""
import contextlib
import os
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import network  # noqa: E402

if os.environ.get("LAYOUT_OPT") == "0":
    import torch._inductor.config

    torch._inductor.config.layout_optimization = False


class ChannelsLastLIF(nn.Module):
    """Our LIF on x [T, B, C, H, W] laid out channels-last: run on x.permute(0, 1, 3, 4, 2), a contiguous view."""

    def __init__(self):
        super().__init__()
        from autocuda.nn import LIFNode

        self.lif = LIFNode(tau=network.TAU, step_mode="m")

    def reset(self):
        self.lif.reset()

    def forward(self, x):
        return self.lif(x.permute(0, 1, 3, 4, 2)).permute(0, 1, 4, 2, 3)


network.NEURONS["ours-cl"] = ChannelsLastLIF
network.NEURONS["ours-cl-compiled-ro"] = ChannelsLastLIF
network.NEURONS["ours-cl-compiled"] = ChannelsLastLIF
network.NEURONS["loop-cl"] = network.LoopLIF
network.NEURONS["loop-cl-compiled-ro"] = network.LoopLIF
network.NEURONS["loop-cl-compiled"] = network.LoopLIF


def run(system, T, B, precision):
    device = torch.device("cuda")
    torch.manual_seed(0)
    cl = "-cl" in system
    model = network.SpikingVGG(network.NEURONS[system]).to(device)
    if cl:
        model = model.to(memory_format=torch.channels_last)
    mode = network.mode_of(system)
    if mode != "eager":
        torch._dynamo.reset()
        model = torch.compile(model, mode=mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    if cl:
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    target = torch.randint(0, 10, (B,), device=device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16"
                else contextlib.nullcontext())

    def step():
        if mode == "reduce-overhead":
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
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in times)
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"{system:24s} {precision:9s} LO={os.environ.get('LAYOUT_OPT', '1')} step {ms:6.3f} ms  peak {peak:7.0f} MiB",
          flush=True)


precision = sys.argv[2] if len(sys.argv) > 2 else "float32"
for system in sys.argv[1].split(","):
    try:
        run(system, 4, 64, precision)
    except Exception as error:
        print(system, "failed", type(error).__name__, str(error)[-400:], flush=True)
