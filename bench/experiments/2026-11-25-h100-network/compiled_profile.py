"""Why a compiled model with our LIFNode is slower than eager: graph breaks, and a profile of one step each way."""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.append(".")
from bench.network import SpikingVGG, _ours, _reset  # noqa: E402

T, B = (int(v) for v in sys.argv[1].split("x")) if len(sys.argv) > 1 else (4, 64)
device = torch.device("cuda")
torch.manual_seed(0)
x = torch.rand(T, B, 3, 32, 32, device=device)
target = torch.randint(0, 10, (B,), device=device)


def make(compiled):
    model = SpikingVGG(_ours).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = torch.compile(model) if compiled else model

    def step():
        _reset(model)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(run(x), target).backward()
        opt.step()
    return model, step


model, _ = make(False)
explained = torch._dynamo.explain(model)(x)
print(f"explain: graphs {explained.graph_count}, graph breaks {explained.graph_break_count}, "
      f"ops {explained.op_count}")
for reason in explained.break_reasons[:10]:
    print("  break:", str(reason.reason)[:200], "|", reason.user_stack[-1] if reason.user_stack else "")
torch._dynamo.reset()

for compiled in (False, True):
    _, step = make(compiled)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    print(f"\n=== compiled={compiled}: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms per step (wall)")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"CUDA kernels per step {sum(e.count for e in kernels) / 3:.0f}, "
          f"GPU time per step {sum(e.self_device_time_total for e in kernels) / 3 / 1e3:.2f} ms")
    print(events.table(sort_by="self_cuda_time_total", row_limit=22, max_name_column_width=70))
