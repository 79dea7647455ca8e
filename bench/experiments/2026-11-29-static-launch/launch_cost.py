"""Host time of one small LIF forward launch (T=4, N=4096, float32) through our ctypes launcher and through torch's
own C++ launcher of Inductor (`torch._C._StaticCudaLauncher._launch_kernel`), and of the calls around it. Both
launchers' spikes are checked equal. Prints a table; writes launch_cost.json to the folder given."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from autocuda import ops  # noqa: E402
from autocuda.calls import _layer  # noqa: E402
from autocuda.functional import multi_step  # noqa: E402
from autocuda.runtime.launch import current_stream_ptr  # noqa: E402
from bench.host_floor import Bare  # noqa: E402

TYPES = {"Q": "K", "f4x": "f", "d": "d", "q": "l", "i4x": "i", "I4x": "I", "B7x": "B", "?7x": "B"}
static = getattr(torch._C, "_StaticCudaLauncher", None)
print("torch", torch.__version__, "static launcher:", static is not None)
x = torch.rand(4, 4096, device="cuda") * 2
torch.set_grad_enabled(False)
multi_step("lif", x, tau=2.0)
layer = _layer("lif", x, None, False, None, None, {"tau": 2.0})
form = ops.forward_form(layer.key, False, False, False, False, True)
scalars = list(layer.scalar_values({**layer.defaults, "tau": 2.0}))
args = (x, 0.0, *scalars)
recipe, binding = next(iter(form.kernel._bound.values()))
spike, v = torch.empty_like(x), x.new_empty(4096)
values = binding.arrange([4096, 4, spike.data_ptr(), v.data_ptr(), x.data_ptr(), *args])
kernel = recipe.kernel
packed = kernel.cuda_launcher(0)
fmt, codes = packed.format[1:], []
while fmt:
    code = next(c for c in sorted(TYPES, key=len, reverse=True) if fmt.startswith(c))
    codes.append(TYPES[code])
    fmt = fmt[len(code):]
arg_tys = "".join(codes)
block = kernel.block
grid = (-(-4096 // kernel.lanes) + block - 1) // block
stream = current_stream_ptr(0)
function = packed.launcher.function
values_t = tuple(values)
calls = {
    "empty_like + new_empty": lambda: (torch.empty_like(x), x.new_empty(4096)),
    "bare autograd.Function, no grad": lambda: Bare.apply(x),
    "ctypes PackedLaunch (pack + launch)": lambda: packed((grid,), (block,), values, stream),
    "current_stream_ptr": lambda: current_stream_ptr(0),
    "multi_step": lambda: multi_step("lif", x, tau=2.0),
}
if static is not None:
    launch = static._launch_kernel
    calls["torch StaticCudaLauncher (pack + launch)"] = lambda: launch(function, grid, 1, 1, block // 32, 0, arg_tys,
                                                                       values_t, stream)
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
if static is not None:
    spike.zero_()
    static._launch_kernel(function, grid, 1, 1, block // 32, 0, arg_tys, values_t, stream)
    torch.cuda.synchronize()
    rows.append({"piece": "static launcher's spikes equal ours",
                 "us": float(torch.equal(spike, multi_step("lif", x, tau=2.0)[0]))})
out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
out.mkdir(parents=True, exist_ok=True)
(out / "launch_cost.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                  "arg_tys": arg_tys, "rows": rows}, indent=1))
print(f"{'piece':<44} {'us/call':>8}")
for r in rows:
    print(f"{r['piece']:<44} {r['us']:>8.2f}")
