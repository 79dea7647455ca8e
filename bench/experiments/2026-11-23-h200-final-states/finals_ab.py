"""Ours with and without final states, interleaved in one process: % of the floor (float32 inference)."""
import torch

from autocuda import benchmark as bench

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
bw = bench.copy_bandwidth(clock, False)
print(f"copy bandwidth {bw/1e9:.0f} GB/s")
shapes = [(8, 8 << 20), (64, 1 << 20)]
for key in ("lif", "parametric_lif", "qif", "eif", "izhikevich", "adex"):
    for steps, n in shapes:
        case = bench.Case.draw(bench.WORKLOADS[key], torch.float32, steps, n, dev)
        floor = steps * n * 8 / bw * 1e3
        times = {True: [], False: []}
        for _ in range(3):
            for fs in (True, False):
                times[fs].append(clock.median(bench.call(case, bench.ours(case, final_states=fs))))
        a, b = min(times[True]), min(times[False])
        print(f"{key:<15} ({steps}, {n}): with finals {a:.4f} ms {100*floor/a:5.1f}%  without {b:.4f} ms "
              f"{100*floor/b:5.1f}%  ratio {a/b:.3f}", flush=True)
        del case
        torch.cuda.empty_cache()
