"""Host time per call of the neuron op through torch's custom-op dispatcher against the eager path, LIF on
x [4, 64*64*32*32] (the first block of the network), no grad; and torch's backend_impl source there."""
import inspect
import sys
import time

import torch
import torch._library.custom_ops as custom_ops

from autocuda import functional as F, ops
from autocuda.spec.load import load_spec

src = inspect.getsource(custom_ops)
at = src.find("def backend_impl")
print(src[at - 200: at + 2500])

x = torch.rand(4, 64 * 64 * 32 * 32, device="cuda")
captured = {}
original = ops.forward_eager


def capture(form, *args):
    captured.setdefault("args", (form, args))
    return original(form, *args)


ops.forward_eager = capture
F.multi_step(load_spec("lif"), x, 0.0, tau=2.0, v_threshold=1.0, v_reset=0.0)
ops.forward_eager = original
form, (xx, states, initial, tensor_params, scalars) = captured["args"]
op_args = (form.key, xx, list(states), list(initial), list(tensor_params), list(scalars), False, form.save, True)
small = torch.rand(4, 4096, device="cuda")
for label, xs in (("big", xx), ("small", small)):
    args = (op_args[0], xs, *op_args[2:])
    for name, call in (("eager path", lambda: ops.forward_eager(form, xs, list(states), list(initial),
                                                                 list(tensor_params), list(scalars))),
                       ("custom op", lambda: torch.ops.autocuda.neuron_forward(*args)),
                       ("custom op .default", lambda: torch.ops.autocuda.neuron_forward.default(*args))):
        with torch.no_grad():
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            best = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(200):
                    call()
                torch.cuda.synchronize()
                best.append((time.perf_counter() - t) / 200 * 1e6)
        print(f"{label:<6} {name:<20} {min(best):8.1f} us per call (GPU-bound if big)", flush=True)
sys.stdout.flush()
