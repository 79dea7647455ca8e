"""Why the tuner picks 8-byte accesses at (64, 1M) float32 inference while the benchmark finds 16-byte faster:
each layout timed four ways, interleaved, ms per call (median of 7 repetitions of each way):
  b2b:   the tuner's way (GPU sleep, then 3 runs back to back between two events)
  flush: the benchmark's way (256 MiB zero_, GPU sleep, one run)
  l2:    an L2-sized zero_ (the device's L2 size), GPU sleep, one run
  b2b+l2: l2 flush before each of 3 runs, each timed alone, mean."""
import statistics

import torch
from autocuda.runtime.cache import resolve_spec

from autocuda.runtime import neuron

dev = torch.device("cuda")
L2 = torch.cuda.get_device_properties(dev).L2_cache_size
print(torch.cuda.get_device_name(), "L2", L2 >> 20, "MiB")
big = torch.empty(64 << 20, dtype=torch.int32, device=dev)
small = torch.empty(L2 // 4, dtype=torch.int32, device=dev)
LAYOUTS = {"8B": {"lanes": 2, "vector": True, "unroll": 2}, "16B": {"lanes": 4, "vector": True, "unroll": 2}}


def events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def b2b(run):
    s, e = events()
    torch.cuda._sleep(1_000_000)
    s.record()
    for _ in range(3):
        run()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 3


def flushed(buf):
    def way(run):
        buf.zero_()
        torch.cuda._sleep(1_000_000)
        s, e = events()
        s.record()
        run()
        e.record()
        e.synchronize()
        return s.elapsed_time(e)
    return way


WAYS = {"b2b": b2b, "flush": flushed(big), "l2": flushed(small)}
for name in ("lif", "parametric_lif", "izhikevich"):
    spec = resolve_spec(name)
    tensors = tuple((p.name, False) for p in spec.params if p.kind == "tensor")
    config = neuron.NeuronConfig(spec, spec.surrogate, "hard", tensors=tensors)
    for steps, n in ((64, 1 << 20), (8, 8 << 20)):
        x = torch.randn(steps, n, device=dev) * 2 + 0.5
        params = {p.name: p.default for p in spec.params if p.kind != "tensor"}
        params |= {p.name: torch.full((1,), 0.5, device=dev) for p in spec.params if p.kind == "tensor"}
        inits = {s.name: 0.0 for s in spec.states}
        times = {}
        for _ in range(7):
            for lname, layout in LAYOUTS.items():
                def run(layout=layout, config=config, x=x, inits=inits, params=params):
                    return neuron.forward(config, x, inits, params, save_for_backward=False, final_states=False,
                                          layout=layout)
                run()
                for wname, way in WAYS.items():
                    times.setdefault((lname, wname), []).append(way(run))
        cells = []
        for wname in WAYS:
            a, b = (statistics.median(times[(ln, wname)]) for ln in LAYOUTS)
            faster = "16B" if b < a else "8B"
            cells.append(f"{wname}: 8B {a:.4f} 16B {b:.4f} ({faster} by {abs(a - b) / max(a, b) * 100:.1f}%)")
        print(f"{name:15s} ({steps}, {n >> 20}M): " + " | ".join(cells), flush=True)
        del x
