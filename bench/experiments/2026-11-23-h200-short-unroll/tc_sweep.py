"""TwoCompartment bfloat16 inference (spikes alone) at (64, 1M) and (8, 8M) by layout, % of the floor, beside LIF."""
import torch
from autocuda.runtime.cache import resolve_spec

from autocuda import benchmark as bench
from autocuda.runtime import neuron

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
bw = bench.copy_bandwidth(clock, False)
print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
LAYOUTS = [{"lanes": lanes, "vector": True, "unroll": unroll, "block": block}
           for lanes in (2, 4, 8) for unroll in (1, 2, 4) for block in (128, 256)] + [None]
for name in ("two_compartment", "lif"):
    spec = resolve_spec(name)
    config = neuron.NeuronConfig(spec, spec.surrogate, "hard")
    for steps, n in ((64, 1 << 20), (8, 8 << 20)):
        x = (torch.randn(steps, n, device=dev) * 2 + 0.5).to(torch.bfloat16)
        params = {p.name: p.default for p in spec.params}
        inits = {s.name: 0.0 for s in spec.states}
        floor = steps * n * 4 / bw * 1e3
        results = []
        for layout in LAYOUTS:
            def run(layout=layout, x=x, params=params, inits=inits, config=config):
                return neuron.forward(config, x, inits, params, save_for_backward=False, final_states=False,
                                      layout=layout)
            run()
            results.append((min(clock.median(run) for _ in range(3)), layout))
        tuned = [r for r in results if r[1] is None][0]
        results.sort(key=lambda r: r[0])
        print(f"{name} ({steps}, {n}):", "; ".join(f"{100 * floor / t:.1f}% {lay}" for t, lay in results[:4]),
              f"| worst {100 * floor / results[-1][0]:.1f}% {results[-1][1]} | tuner's {100 * floor / tuned[0]:.1f}%",
              flush=True)
        del x
