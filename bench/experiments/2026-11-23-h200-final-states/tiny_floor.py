"""The floor of one kernel at (4, 4096), timed as the benchmark times (Clock): a copy of x, and ours."""
import torch

from autocuda import benchmark as bench

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(4, 4096, device=dev).to(dtype)
    y = torch.empty_like(x)
    rows = {"copy_ (one kernel: read x, write y)": lambda x=x, y=y: y.copy_(x),
            "x + 1 (one kernel, allocates)": lambda x=x: x + 1}
    for key in ("lif", "eif", "izhikevich"):
        case = bench.Case.draw(bench.WORKLOADS[key], dtype, 4, 4096, dev)
        rows[f"ours {key} inference"] = bench.call(case, bench.ours(case, final_states=False))
        rows[f"compile {key} inference"] = bench.call(case, bench.compiled(case, final_states=False))
    for name, fn in rows.items():
        for _ in range(3):
            fn()
        times = sorted(clock.median(fn) * 1000 for _ in range(5))
        print(f"{str(dtype)[6:]:<9} {name:<40} {times[2]:.2f} us (of 5 medians {times[0]:.2f}-{times[-1]:.2f})",
              flush=True)
