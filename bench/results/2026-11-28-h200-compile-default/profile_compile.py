"""Where a compiled (default mode) VGG step's time goes: ours vs the compiled loop, T=4 B=64, fp32 and AMP bf16."""
import contextlib, sys, time, statistics, json
import torch
from torch import nn
sys.path.insert(0, ".")
from bench import network
from torch.profiler import profile, ProfilerActivity
out = sys.argv[1]
dev = torch.device("cuda")
res = {}
for system in sys.argv[2].split(","):
  for precision in ("float32", "bfloat16"):
    torch.manual_seed(0)
    model = network.build(system, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    T, B = 4, 64
    x = torch.rand(T, B, 3, 32, 32, device=dev)
    if system.endswith("-cl"):
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    tgt = torch.randint(0, 10, (B,), device=dev)
    ac = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bfloat16" else contextlib.nullcontext()
    def step():
        network._reset(model); opt.zero_grad(set_to_none=True)
        with ac:
            loss = nn.functional.cross_entropy(model(x), tgt)
        loss.backward(); opt.step()
    for _ in range(8): step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(20): step()
        torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) / 20 * 1e3)
    # host time per step without waiting on the GPU: the CPU side alone
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10): step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    kern = sorted([e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA], key=lambda e: -e.device_time_total)
    tot_gpu = sum(e.device_time_total for e in kern) / 10 / 1e3
    res[f"{system}-{precision}"] = {"step_ms": statistics.median(ts), "gpu_kernel_ms": tot_gpu, "n_kernels": sum(e.count for e in kern) / 10,
        "top": [(e.key[:90], round(e.device_time_total / 10 / 1e3, 4), e.count // 10) for e in kern[:25]]}
    print(system, precision, res[f"{system}-{precision}"]["step_ms"], tot_gpu, res[f"{system}-{precision}"]["n_kernels"], flush=True)
json.dump(res, open(out + "/profile.json", "w"), indent=1)
