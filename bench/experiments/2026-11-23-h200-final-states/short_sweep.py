"""Short loops over many neurons: float32 inference (spikes alone) by layout, % of the floor (kernels alone)."""
import torch
from autocuda.runtime.cache import resolve_spec

from autocuda import benchmark as bench
from autocuda.runtime import neuron

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
bw = bench.copy_bandwidth(clock, False)
print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
LAYOUTS = [{"lanes": lanes, "vector": True, "unroll": unroll} for lanes in (2, 4) for unroll in (1, 2, 4, 8)]
LAYOUTS += [{"lanes": 2, "vector": True, "unroll": 2, "prefetch": 2},
            {"lanes": 4, "vector": True, "unroll": 4, "block": 128}, None]  # None: the layout the tuner picks
for name in ("lif", "parametric_lif", "izhikevich"):
    spec = resolve_spec(name)
    tensors = tuple((p.name, False) for p in spec.params if p.kind == "tensor")
    config = neuron.NeuronConfig(spec, spec.surrogate, "hard", tensors=tensors)
    for steps, n in ((64, 1 << 20), (8, 8 << 20)):
        x = torch.randn(steps, n, device=dev) * 2 + 0.5
        params = {p.name: p.default for p in spec.params if p.kind != "tensor"}
        params |= {p.name: torch.full((1,), 0.5, device=dev) for p in spec.params if p.kind == "tensor"}
        inits = {s.name: 0.0 for s in spec.states}
        floor = steps * n * 8 / bw * 1e3
        results = []
        for layout in LAYOUTS:
            def run(layout=layout, config=config, x=x, inits=inits, params=params):
                return neuron.forward(config, x, inits, params, save_for_backward=False, final_states=False,
                                      layout=layout)
            try:
                run()
                best = min(clock.median(run) for _ in range(3))
                results.append((best, layout))
            except Exception as error:  # noqa: BLE001
                print("  ", layout, "error", str(error)[:100])
        results.sort(key=lambda r: r[0])
        print(f"{name} ({steps}, {n}):", "; ".join(f"{100 * floor / t:.1f}% {chosen}" for t, chosen in results[:5]),
              flush=True)
        x = None
        torch.cuda.empty_cache()
