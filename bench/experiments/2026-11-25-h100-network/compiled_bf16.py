"""The model with our LIFNode under AMP bfloat16, eager against compiled: wall and GPU time per step, the top
kernels, Dynamo's counters, and the dtypes our op sees in inductor's code."""
import io
import logging
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.append(".")
from bench.network import SpikingVGG, _ours, _reset  # noqa: E402

device = torch.device("cuda")
torch.manual_seed(0)
x = torch.rand(4, 64, 3, 32, 32, device=device)
target = torch.randint(0, 10, (64,), device=device)
stream = io.StringIO()
logging.getLogger("torch._inductor").addHandler(logging.StreamHandler(stream))
torch._logging.set_logs(output_code=True)

for compiled in (False, True):
    model = SpikingVGG(_ours).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = torch.compile(model) if compiled else model

    def step():
        _reset(model)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(run(x), target)
        loss.backward()
        opt.step()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    print(f"\n=== compiled={compiled}: {(time.perf_counter() - t) / 30 * 1e3:.2f} ms per step (wall)")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"GPU time per step {sum(e.self_device_time_total for e in events) / 3 / 1e3:.2f} ms, "
          f"kernels per step {sum(e.count for e in events) / 3:.0f}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
        print(f"  {e.self_device_time_total / 3 / 1e3:7.3f} ms  x{e.count // 3:<3} {e.key[:110]}")
from torch._dynamo.utils import counters  # noqa: E402

print("dynamo counters:", {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break", "recompiles")})
lines = stream.getvalue().splitlines()
for line in lines:
    if "autocuda.neuron_forward.default](args" in line or "autocuda.neuron_backward.default](args" in line:
        print(line.split("[__output_code]")[-1].strip()[:260])
