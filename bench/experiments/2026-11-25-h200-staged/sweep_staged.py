"""Every long-loop candidate's time per kernel (the tuner's own timing), for the core models at long shapes."""
import sys

import torch

import autocuda.functional as F
from autocuda.runtime import tuning

log = []
_orig = tuning._elapsed_ms
current = {}


def timed(run, flush=None):
    ms = _orig(run, flush)
    log.append(ms)
    return ms


tuning._elapsed_ms = timed
_fastest = tuning.fastest


def fastest(text, device, layouts, run):
    log.clear()
    best = _fastest(text, device, layouts, run)
    kind = "bptt" if "'bptt'" in text else "fptt"
    rows = []
    for layout, ms in zip(layouts, log):
        vector = "v" if layout["vector"] else ""
        tag = f"L{layout['lanes']}{vector}/p{layout['prefetch']}/s{layout.get('staged', 0)}/b{layout['block']}"
        rows.append((tag, ms))
    base = min(ms for (tag, ms) in rows if "/s0/" in tag)
    win = min(rows, key=lambda r: r[1])
    print(f"  {current['what']} {kind:4s} best {win[0]:16s} {win[1]*1e3:7.1f} us | "
          f"best without staged {base*1e3:7.1f} us | "
          f"gain {base/win[1]:.2f}x | " + " ".join(f"{t}:{m*1e3:.1f}" for t, m in rows), flush=True)
    return best


tuning.fastest = fastest
models = sys.argv[1].split(",")
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")]
for name in models:
    for dname in ("float32", "bfloat16", "float16"):
        for steps, n in shapes:
            current["what"] = f"{name:14s} {dname:8s} ({steps},{n})"
            x = (torch.randn(steps, n, device="cuda") * 2 + 0.5).to(getattr(torch, dname)).requires_grad_(True)
            with torch.no_grad():
                F.multi_step(name, x, final_states=False)
            s = F.multi_step(name, x, final_states=False)[0]
            torch.autograd.grad(s, x, torch.randn_like(s))
