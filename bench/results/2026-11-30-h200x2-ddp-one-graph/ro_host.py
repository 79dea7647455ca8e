"""Host time of reduce-overhead VGG steps (AMP bf16), per phase, with and without DDP (one process).

Run from the repository root on one GPU (`ro_host.sh`); prints Dynamo's counters, the step's wall and GPU time,
the host time of each phase (median, p10, p90), the GPU time of steps queued behind a GPU-side wait, and for ours
cProfile's top functions.
"""
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import time

import torch
import torch._dynamo.utils as du
import torch.distributed as dist
from torch import nn

from bench import network

T, B = 4, 64
PHASES = ("reset", "zero", "forward", "backward", "opt")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")


def ddp_wrap(model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[0], gradient_as_bucket_view=True, broadcast_buffers=False)


def print_profile(step) -> None:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    profile.disable()
    for order, count, chars in (("tottime", 25, 5000), ("cumtime", 40, 7000)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
        print(text.getvalue()[:chars])


def run(system: str, precision: str, ddp: bool, profile: bool) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    du.counters.clear()
    torch._dynamo.reset()
    model = network.build(system, device, ddp_wrap if ddp else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    target = torch.randint(0, 10, (B,), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16" else contextlib.nullcontext()
    phases: dict[str, list[float]] = {k: [] for k in (*PHASES, "total")}

    def step(record: bool = False) -> None:
        marks = [time.perf_counter()]
        torch.compiler.cudagraph_mark_step_begin()
        network._reset(model)
        marks.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        with autocast:
            loss = nn.functional.cross_entropy(model(x), target)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        opt.step()
        marks.append(time.perf_counter())
        if record:
            for i, name in enumerate(PHASES):
                phases[name].append((marks[i + 1] - marks[i]) * 1e3)
            phases["total"].append((marks[-1] - marks[0]) * 1e3)

    for _ in range(15):
        step()
    torch.cuda.synchronize()
    counts = {k: dict(v) for k, v in du.counters.items() if k in ("stats", "graph_break", "recompiles")}
    print("==", system, precision, "ddp" if ddp else "", counts, flush=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(100):
        step(True)
    end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / 100 * 1e3
    print(f"  wall/step {wall:.3f} ms, gpu/step {start.elapsed_time(end) / 100:.3f} ms")
    for k, v in phases.items():
        q = statistics.quantiles(v, n=10)
        print(f"  host {k:9} median {statistics.median(v):.3f}  p10 {q[0]:.3f}  p90 {q[-1]:.3f} ms")
    # GPU time alone: the step's work queued behind a GPU-side wait
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start.record()
    for _ in range(20):
        step()
    end.record()
    torch.cuda.synchronize()
    print(f"  gpu/step queued behind a wait {start.elapsed_time(end) / 20:.3f} ms")
    if profile:
        print_profile(step)


dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
for system in ("ours-compiled-ro-cl", "loop-compiled-ro-cl"):
    for ddp in (False, True):
        run(system, "bfloat16", ddp, profile=system.startswith("ours"))
dist.destroy_process_group()
