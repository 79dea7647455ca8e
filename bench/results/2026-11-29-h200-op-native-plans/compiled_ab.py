"""Host-bound compiled training steps: the ops' implementations by native plans (native.USE on) against the Python
launch (off), toggled in one process, order rotated. Prints a table; writes JSON to argv[1] where given."""
import json
import statistics
import sys
import time

import torch

from autocuda import nn as ann
from autocuda.call import native

torch.manual_seed(0)
DEVICE = "cuda"
native.ensure()


def mlp(width: int, layers: int) -> torch.nn.Sequential:
    modules: list[torch.nn.Module] = []
    for _ in range(layers):
        modules += [torch.nn.Linear(width, width), ann.LIFNode(step_mode="m")]
    return torch.nn.Sequential(*modules).to(DEVICE)


def measure(steps: int, batch: int, width: int, layers: int, dtype: torch.dtype) -> dict[str, float]:
    net = mlp(width, layers)
    x = torch.rand(steps, batch, width, device=DEVICE)
    compiled = torch.compile(net)

    def step() -> None:
        for module in net:
            if hasattr(module, "reset"):
                module.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = compiled(x)
        out.float().sum().backward()

    def timed(n: int = 200) -> float:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    for on in (True, False):
        native.USE = on
        for _ in range(30):
            step()
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(8):
        for on in (True, False) if r % 2 == 0 else (False, True):
            native.USE = on
            times[on].append(timed())
    native.USE = True
    return {"native_us": statistics.median(times[True]), "python_us": statistics.median(times[False])}


results = {}
for shape in [(4, 16, 256, 2, torch.float32), (4, 16, 256, 4, torch.float32), (4, 64, 512, 4, torch.bfloat16)]:
    steps, batch, width, layers, dtype = shape
    name = f"T={steps} B={batch} width={width} layers={layers} {str(dtype).split('.')[-1]}"
    r = results[name] = measure(*shape)
    print(f"{name:45s} native {r['native_us']:8.1f} us  python {r['python_us']:8.1f} us  "
          f"ratio {r['native_us'] / r['python_us']:.3f}", flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        json.dump(results, out, indent=1)
