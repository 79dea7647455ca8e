"""Profile one bench.network system's training step (T=4, B=64) on one GPU, inside a DistributedDataParallel of one
process (NCCL) or without it:

    python profile_step.py SYSTEM PRECISION ddp|plain

Environment: V holds `view` (gradient_as_bucket_view=True) and/or `nobc` (broadcast_buffers=False); ROWS, the rows
of the self-CPU table (default 15); NOPROF=1 times the steps without the profiler."""
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile

from bench import network

system, precision, ddp = sys.argv[1], sys.argv[2], sys.argv[3] == "ddp"
variant = os.environ.get("V", "")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29555")
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
if ddp:
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
torch.manual_seed(0)
options = {"gradient_as_bucket_view": "view" in variant, "broadcast_buffers": "nobc" not in variant}
model = network.build(system, device, (lambda m: DistributedDataParallel(m, device_ids=[0], **options)) if ddp
                      else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.rand(4, 64, 3, 32, 32, device=device)
if system.endswith("-cl"):
    x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (4, 64))
target = torch.randint(0, 10, (64,), device=device)
autocast = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16" else contextlib.nullcontext()


def step() -> None:
    torch.compiler.cudagraph_mark_step_begin()
    network._reset(model)
    opt.zero_grad(set_to_none=True)
    with autocast:
        loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    opt.step()


for _ in range(15):
    step()
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(20):
    step()
torch.cuda.synchronize()
print(f"== V={variant} {system} {precision} {'ddp' if ddp else 'plain'}: "
      f"{(time.perf_counter() - start) / 20 * 1e3:.2f} ms/step wall")
if not os.environ.get("NOPROF"):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="device_time_total", row_limit=22, max_name_column_width=60))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=int(os.environ.get("ROWS", "15")),
                         max_name_column_width=70))
if ddp:
    dist.destroy_process_group()
