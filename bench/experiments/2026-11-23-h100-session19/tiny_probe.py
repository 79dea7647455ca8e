"""(4, 4096) float32 inference as the benchmark times it (Clock): ours for each core model over several fresh
inputs, the kernel's registers, and a copy_; why QIF took 3.68 us and LIF 4.10 on an H100."""
import torch

from autocuda import benchmark as bench

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
x = torch.randn(4, 4096, device=dev)
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
print(f"copy_ {sorted(clock.median(lambda: y.copy_(x)) * 1e3 for _ in range(5))[2]:.2f} us")
for key in ("lif", "qif", "eif", "izhikevich", "parametric_lif"):
    cells = []
    for _ in range(4):
        case = bench.Case.draw(bench.WORKLOADS[key], torch.float32, 4, 4096, dev)
        fn = bench.call(case, bench.ours(case, final_states=False))
        for _ in range(3):
            fn()
        cells.append(sorted(clock.median(fn) * 1e3 for _ in range(5))[2])
    print(f"{key:15s} " + " ".join(f"{c:.2f}" for c in cells), flush=True)
