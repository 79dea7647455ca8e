"""Host time of the pieces of a small LIF call (T=4, N=4096, float32) on the lent GPU, and of a C launcher
prototype (`fastlaunch.c`, compiled here with the system compiler): does a launch in C leave room for the issue-28
host targets? Prints a table; writes launch_parts.json to the folder given."""
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from autocuda import ops  # noqa: E402
from autocuda.calls import _layer  # noqa: E402
from autocuda.functional import multi_step  # noqa: E402
from autocuda.nn import LIFNode  # noqa: E402
from autocuda.runtime.launch import current_stream_ptr  # noqa: E402
from bench.host_floor import Bare  # noqa: E402

build = Path(tempfile.mkdtemp())
subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(HERE / "fastlaunch.c"),
                "-o", str(build / ("fastlaunch" + sysconfig.get_config_var("EXT_SUFFIX"))), "-ldl"], check=True)
sys.path.insert(0, str(build))
import fastlaunch  # noqa: E402

x = torch.rand(4, 4096, device="cuda") * 2
torch.set_grad_enabled(False)
multi_step("lif", x, tau=2.0)
layer = _layer("lif", x, None, False, None, None, {"tau": 2.0})
form = ops.forward_form(layer.key, False, False, False, False, True)
scalars = list(layer.scalar_values({**layer.defaults, "tau": 2.0}))
init = [0.0]
kc = form.kernel
args = (x, *init, *scalars)
recipe, binding = next(iter(kc._bound.values()))
spike, v = torch.empty_like(x), x.new_empty(4096)
pool = [4096, 4, spike.data_ptr(), v.data_ptr(), x.data_ptr(), *args]
values = binding.arrange(pool)
kernel = recipe.kernel
packed = kernel.cuda_launcher(0)
launcher = packed.launcher
block = kernel.block
grid = ((-(-4096 // kernel.lanes) + block - 1) // block,)
stream = current_stream_ptr(0)
fmt = packed.format[1:].replace("4x", "").replace("7x", "").encode()
function, context = launcher.function, launcher.context
mod = LIFNode(tau=2.0, step_mode="m")
get_current = launcher._get_current
ref = launcher._current_ref
a, b, c = torch.rand(16, device="cuda"), torch.rand(16, device="cuda"), torch.empty(16, device="cuda")
xg = x.clone().requires_grad_(True)
grad = torch.ones_like(x)


def train(fn):
    def call():
        with torch.enable_grad():
            fn(xg).backward(grad)
    return call


calls = {
    "torch.add(out=) 16 floats": lambda: torch.add(a, b, out=c),
    "empty_like x2 + new_empty": lambda: (torch.empty_like(x), torch.empty_like(x), x.new_empty(4096)),
    "bare autograd.Function, no grad": lambda: Bare.apply(x),
    "ctypes cuCtxGetCurrent": lambda: get_current(ref),
    "ctypes Launcher.launch (slots preset)": lambda: launcher.launch((grid[0], 1, 1), (block, 1, 1), stream),
    "PackedLaunch (pack + launch)": lambda: packed(grid, (block,), values, stream),
    "C fastlaunch (pack + launch)": lambda: fastlaunch.launch(function, context, grid[0], block, stream, fmt, *values),
    "current_stream_ptr": lambda: current_stream_ptr(0),
    "recipe.run_args": lambda: recipe.run_args(binding, args, x, 4096, 4, "cuda"),
    "ops.forward_eager": lambda: ops.forward_eager(form, x, [], init, [], scalars, ()),
    "functional.multi_step": lambda: multi_step("lif", x, tau=2.0),
    "LIFNode (reset + call)": lambda: (mod.reset(), mod(x)),
    "train: bare autograd.Function": train(lambda u: Bare.apply(u)[0]),
    "train: functional.multi_step": train(lambda u: multi_step("lif", u, tau=2.0)[0]),
    "train: LIFNode": train(lambda u: (mod.reset(), mod(u))[1]),
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
    rows.append({"piece": name, "us": statistics.median(ts)})
# the C launcher's kernel ran: its spikes equal the ctypes launch's
spike.zero_()
fastlaunch.launch(function, context, grid[0], block, stream, fmt, *values)
torch.cuda.synchronize()
expected = multi_step("lif", x, tau=2.0)[0]
rows.append({"piece": "C launcher's spikes equal ours", "us": float(torch.equal(spike, expected))})
out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
out.mkdir(parents=True, exist_ok=True)
(out / "launch_parts.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
print(f"{'piece':<40} {'us/call':>8}")
for r in rows:
    print(f"{r['piece']:<40} {r['us']:>8.2f}")
