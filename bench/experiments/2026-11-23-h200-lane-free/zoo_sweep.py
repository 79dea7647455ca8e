"""float32 inference (spikes alone) by layout for zoo models vs LIF, % of the floor, kernels as the benchmark times
them (Clock: L2 flushed, GPU sleep); best of three medians; the five fastest per model and shape, and the tuner's."""
import torch
from autocuda.runtime.cache import resolve_spec

from autocuda import benchmark as bench
from autocuda.runtime import neuron

dev = torch.device("cuda")
clock = bench.Clock(dev, quick=False)
bw = bench.copy_bandwidth(clock, False)
print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
LAYOUTS = [{"lanes": lanes, "vector": True, "unroll": unroll, "block": block}
           for lanes in (2, 4) for unroll in (1, 2, 4) for block in (128, 256, 512)]
LAYOUTS += [{"lanes": 0, "vector": False, "unroll": 2}, {"lanes": 2, "vector": True, "unroll": 2, "prefetch": 2}]
LAYOUTS += [None]
for name in ("two_compartment", "lif", "alif"):
    spec = resolve_spec(name)
    config = neuron.NeuronConfig(spec, spec.surrogate, "hard")
    for steps, n in ((64, 1 << 20), (8, 8 << 20)):
        x = torch.randn(steps, n, device=dev) * 2 + 0.5
        params = {p.name: p.default for p in spec.params}
        inits = {s.name: 0.0 for s in spec.states}
        floor = steps * n * 8 / bw * 1e3
        results = []
        for layout in LAYOUTS:
            def run(layout=layout, x=x, params=params, inits=inits, config=config):
                return neuron.forward(config, x, inits, params, save_for_backward=False, final_states=False,
                                      layout=layout)
            try:
                run()
                best = min(clock.median(run) for _ in range(3))
                results.append((best, layout))
            except Exception as error:  # noqa: BLE001
                print("  ", layout, "error", str(error)[:100])
        tuned = [r for r in results if r[1] is None]
        results.sort(key=lambda r: r[0])
        print(f"{name} ({steps}, {n}):", "; ".join(f"{100 * floor / t:.1f}% {lay}" for t, lay in results[:5]),
              f"| tuner's {100 * floor / tuned[0][0]:.1f}%" if tuned else "", flush=True)
        del x
        torch.cuda.empty_cache()
