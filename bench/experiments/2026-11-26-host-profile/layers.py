"""Host time per call of each layer of our LIF inference path (T=4, N=4096, float32, no grad), unprofiled, against
torch's own floor: which layer costs what. Prints a table."""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from autocuda import ops  # noqa: E402
from autocuda.calls import _layer  # noqa: E402
from autocuda.functional import multi_step  # noqa: E402
from autocuda.nn import LIFNode  # noqa: E402
from autocuda.runtime import driver, neuron_launch  # noqa: E402
from autocuda.runtime.launch import current_stream_ptr  # noqa: E402
from bench.host_floor import Bare  # noqa: E402

x = torch.rand(4, 4096, device="cuda") * 2
torch.set_grad_enabled(False)
multi_step("lif", x, tau=2.0)
layer = _layer("lif", x, None, False, None, None, {"tau": 2.0})
key = layer.key
e = ops.entry(key)
form = ops.forward_form(key, False, False, False, False, True)
scalars = list(layer.scalar_values({**layer.defaults, "tau": 2.0}))
init = [0.0]
kc = form.kernel
args = (x, *init, *scalars)
recipe, binding = next(iter(kc._bound.values()))
spike, v = torch.empty_like(x), x.new_empty(4096)
pool = [4096, 4, spike.data_ptr(), v.data_ptr(), x.data_ptr(), *args]
values = binding.arrange(pool)
kernel = recipe.kernel
launcher = kernel.cuda_launcher(0)
block = kernel.block
grid = ((-(-4096 // kernel.lanes) + block - 1) // block,)
stream = current_stream_ptr(0)
mod = LIFNode(tau=2.0, step_mode="m")

calls = {
    "empty_like x2 + new_empty": lambda: (torch.empty_like(x), torch.empty_like(x), x.new_empty(4096)),
    "bare autograd.Function (no grad)": lambda: Bare.apply(x),
    "driver launch (slots preset)": lambda: launcher.launcher.launch((grid[0], 1, 1), (block, 1, 1), stream),
    "PackedLaunch (pack + launch)": lambda: launcher(grid, (block,), values, stream),
    "_layout": lambda: neuron_launch._layout(kc.config, kc.kind, kc.flags, kc.names, args, x, 4096, 4, "cuda"),
    "recipe.run_args": lambda: recipe.run_args(binding, args, x, 4096, 4, "cuda"),
    "KernelCall": lambda: kc(args, x, 4096, 4, "cuda"),
    "form.run": lambda: form.run(x, [], init, [], scalars, ()),
    "ops.forward_eager": lambda: ops.forward_eager(form, x, [], init, [], scalars, ()),
    "functional.multi_step": lambda: multi_step("lif", x, tau=2.0),
    "LIFNode (reset + call)": lambda: (mod.reset(), mod(x)),
}
rows = []
for name, call in calls.items():
    for _ in range(500):
        call()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(2000):
            call()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / 2000 * 1e6)
    rows.append((name, statistics.median(ts)))
print(f"{'layer':<36} {'us/call':>8}")
for name, us in rows:
    print(f"{name:<36} {us:>8.2f}")
