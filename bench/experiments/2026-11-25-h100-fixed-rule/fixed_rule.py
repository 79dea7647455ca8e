"""The fixed rule of long loops (what CUDA graph capture and the host runner get): each kernel of the core six
timed as the tuner times a candidate, with `_layout` told a capture is under way."""
import sys

import torch

import autocuda.functional as F
from autocuda.runtime import tuning

torch.cuda.is_current_stream_capturing = lambda: True  # the fixed rule, as under capture
FLUSH = tuning._l2_flush(torch.device("cuda"))
for name in sys.argv[1].split(","):
    for dname in ("float32", "bfloat16"):
        for steps, n in ((1024, 16384), (256, 65536)):
            x = (torch.randn(steps, n, device="cuda") * 2 + 0.5).to(getattr(torch, dname)).requires_grad_(True)

            def inference(x=x, name=name):
                with torch.no_grad():
                    F.multi_step(name, x, final_states=False)

            def forward(x=x, name=name):
                F.multi_step(name, x, final_states=False)
            s = F.multi_step(name, x, final_states=False)[0]
            g = torch.randn_like(s)

            def backward(s=s, g=g, x=x):
                torch.autograd.grad(s, x, g, retain_graph=True)
            times = [tuning._elapsed_ms(fn, FLUSH) * 1e3 for fn in (inference, forward, backward)]
            print(f"{name:14s} {dname:8s} ({steps},{n}) inference {times[0]:7.1f} us  forward {times[1]:7.1f} us  "
                  f"backward {times[2]:7.1f} us  training {times[1] + times[2]:7.1f} us", flush=True)
