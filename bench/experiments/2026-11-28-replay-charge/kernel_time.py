"""GPU time of the kernels of one training call (forward + backward) of a LIF layer and of the fused BatchNorm + LIF neuron, with h
saved (`save_h=True`) and replayed from x (`save_h=False`), alternating in one process: does replaying h pay?
Prints a table; writes kernel_time.json to the folder given."""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import autocuda.functional as F  # noqa: E402
from autocuda.runtime.plans import spec_ref  # noqa: E402
from autocuda.spec.load import load_spec  # noqa: E402
from autocuda.spec.transform import INPUT_SCALE, INPUT_SHIFT, with_input_affine  # noqa: E402

FUSED = spec_ref(with_input_affine(load_spec("lif")))
SHAPES = [(4, 64, 64, 32), (16, 32, 64, 32), (4, 64, 256, 8), (16, 32, 256, 8)]  # T, B, C, H=W


def call(fused: bool, save_h: bool, x, a, b, g):
    if fused:
        spikes, _, _ = F.multi_step(FUSED, x, 0.0, save_h=save_h, final_states=False,
                                    **{INPUT_SCALE: a, INPUT_SHIFT: b})
        torch.autograd.grad(spikes, (x, a, b), g)
    else:
        spikes, _, _ = F.multi_step("lif", x, 0.0, save_h=save_h, final_states=False)
        torch.autograd.grad(spikes, x, g)


def time_ms(fn, reps=20):
    """GPU time of our neuron kernels (forward and backward) per call, from the profiler's kernel records."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    ours = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and ("_fptt_" in e.name or "_bptt_" in e.name)]
    assert len(ours) == 2 * reps, [e.name for e in ours][:4]
    return sum(e.time_range.elapsed_us() for e in ours) / reps / 1000


rows = []
for dtype in (torch.float32, torch.bfloat16):
    for t, batch, c, side in SHAPES:
        torch.manual_seed(0)
        x = (torch.randn(t, batch, c, side, side, device="cuda") + 0.8).to(dtype).requires_grad_(True)
        a = (torch.rand(c, 1, 1, device="cuda") + 0.5).requires_grad_(True)
        b = (torch.rand(c, 1, 1, device="cuda") * 0.2).requires_grad_(True)
        g = torch.randn_like(x)
        for fused in (False, True):
            times = {True: [], False: []}
            for _ in range(2):  # alternate, so that drift hits both alike
                for save_h in (True, False):
                    times[save_h].append(time_ms(lambda: call(fused, save_h, x, a, b, g)))
            kept, replayed = statistics.median(times[True]), statistics.median(times[False])
            rows.append({"dtype": str(dtype).removeprefix("torch."), "T": t, "B": batch, "C": c, "HW": side,
                         "neuron": "BN+LIF fused" if fused else "LIF", "save_h ms": kept, "replayed ms": replayed,
                         "ratio": kept / replayed})
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
out.mkdir(parents=True, exist_ok=True)
(out / "kernel_time.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
print(f"{'dtype':<9} {'T':>3} {'B':>3} {'C':>4} {'HW':>3} {'neuron':<13} {'h saved':>8} {'replayed':>8} {'speedup':>7}")
for r in rows:
    print(f"{r['dtype']:<9} {r['T']:>3} {r['B']:>3} {r['C']:>4} {r['HW']:>3} {r['neuron']:<13} {r['save_h ms']:>8.3f} "
          f"{r['replayed ms']:>8.3f} {r['ratio']:>7.2f}")
