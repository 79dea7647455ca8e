"""GPU time of every kernel of one eager training call (forward + backward) of the fused BatchNorm + LIF layer, in two
backward passes against one (h replayed in both), alternating in one process. Prints a table; writes
bn_passes_time.json to the folder given."""
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import autocuda.nn as ann  # noqa: E402
from autocuda.nn.batchnorm import BatchNormNeuron  # noqa: E402

SHAPES = [(4, 64, 64, 32), (16, 32, 64, 32), (4, 64, 256, 8), (16, 32, 256, 8)]
ORIGINAL = BatchNormNeuron._two_passes_fit


def kernels_ms(layer, x, g, two: bool, reps=10):
    BatchNormNeuron._two_passes_fit = ORIGINAL if two else (lambda self, x: False)
    def call():
        torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), g)
        layer.reset()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / reps / 1000, len(kernels) / reps


rows = []
for t, batch, c, side in SHAPES:
    torch.manual_seed(0)
    layer = ann.BatchNormNeuron(c, ann.LIFNode(step_mode="m")).cuda()
    x = (torch.randn(t, batch, c, side, side, device="cuda") + 0.5).requires_grad_(True)
    g = torch.randn_like(x)
    times = {True: [], False: []}
    counts = {}
    for _ in range(2):
        for two in (False, True):
            ms, n = kernels_ms(layer, x, g, two)
            times[two].append(ms)
            counts[two] = n
    one, two = statistics.median(times[False]), statistics.median(times[True])
    rows.append({"T": t, "B": batch, "C": c, "HW": side, "one pass ms": one, "two passes ms": two,
                 "kernels one": counts[False], "kernels two": counts[True], "speedup": one / two})
BatchNormNeuron._two_passes_fit = ORIGINAL
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
out.mkdir(parents=True, exist_ok=True)
(out / "bn_passes_time.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
print(f"{'T':>3} {'B':>3} {'C':>4} {'HW':>3} {'one pass':>9} {'two':>9} {'kernels':>9} {'speedup':>7}")
for r in rows:
    print(f"{r['T']:>3} {r['B']:>3} {r['C']:>4} {r['HW']:>3} {r['one pass ms']:>9.3f} {r['two passes ms']:>9.3f} "
          f"{r['kernels one']:>4.0f}/{r['kernels two']:<4.0f} {r['speedup']:>7.2f}")
