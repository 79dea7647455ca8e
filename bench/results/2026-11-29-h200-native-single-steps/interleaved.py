"""Single-step training per call at (8, 8M): this tree's programs on (bound launches and native plans for single steps
and state tensors) against off (the unbound Python path: what single steps from state tensors took before) and
SpikingJelly 2.0's class, the three interleaved call by call in one process (the device host's speed drifts)."""
import statistics
import sys
import time

import torch
from spikingjelly.activation_based import neuron as sj

import autocuda.nn as our
from autocuda.call import program

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20


def steps_call(layer, x, online):
    leaves = [x[t].clone().requires_grad_(True) for t in range(x.shape[0])]
    def call():
        layer.reset()
        for leaf in leaves:
            leaf.grad = None
        if online:
            for leaf in leaves:
                out = layer(leaf)
                (out[0] if isinstance(out, (list, tuple)) else out).sum().backward()
        else:
            loss = 0
            for leaf in leaves:
                loss = loss + layer(leaf).sum()
            loss.backward()
    return call


CASES = {"LIFNode s (BPTT over T steps)": (lambda m: m.LIFNode(step_mode="s"), False),
         "OTTTLIFNode (T online steps)": (lambda m: m.OTTTLIFNode(), True),
         "SLTTLIFNode (T online steps)": (lambda m: m.SLTTLIFNode(), True)}
for name, (build, online) in CASES.items():
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.rand(8, N, device="cuda", dtype=dtype)
        calls = {"ours": steps_call(build(our).cuda(), x, online),
                 "sj": steps_call(build(sj).cuda(), x, online)}
        times = {"programs off": [], "programs on": [], "sj": []}
        modes = list(times)
        for rep in range(36):
            for mode in modes[rep % 3:] + modes[:rep % 3]:  # each mode in each place of the order
                program.ENABLED = mode != "programs off"
                call = calls["sj" if mode == "sj" else "ours"]
                torch.cuda.synchronize()
                t = time.perf_counter()
                call()
                torch.cuda.synchronize()
                if rep >= 6:
                    times[mode].append(time.perf_counter() - t)
        med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        print(f"{name} | {str(dtype)[6:]} | N={N} | off {med['programs off']:.3f} ms | on {med['programs on']:.3f} ms"
              f" | on/off {med['programs on'] / med['programs off']:.2f} | SJ {med['sj']:.3f} ms"
              f" | SJ/on {med['sj'] / med['programs on']:.2f}x", flush=True)
