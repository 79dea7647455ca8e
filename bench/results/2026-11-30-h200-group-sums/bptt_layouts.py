"""Noisy LIF's and LIF's BPTT kernel alone at (8, 8M) float32 over layouts: median µs of 20 (CUDA events, after an
L2 flush and a GPU-side wait that covers the host's launch). `python bptt_layouts.py cpu` checks the layouts on the
host runner at a small size."""
import sys

import torch

from autocuda.codegen.broadcast import SHARED
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import load_spec, spec_from_toml
from autocuda.tools.testing import named_launch
from bench.noise import NOISY_LIF

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
STEPS, NEURONS = (8, 8 << 20) if DEVICE == "cuda" else (3, 256)
BACKEND = "cuda" if DEVICE == "cuda" else "host"
LAYOUTS = [None, *(dict(lanes=lanes, vector=lanes > 1, unroll=unroll, block=block)
                   for lanes in (1, 2, 4) for unroll in (1, 2, 4) for block in (64, 128, 256)), None]


def median_us(run) -> float:
    flush = torch.empty(64 << 20, dtype=torch.int32, device=DEVICE)
    times = []
    for _ in range(20):
        flush.zero_()
        torch.cuda._sleep(2_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[10]


def main() -> None:
    torch.manual_seed(0)
    x = torch.rand(STEPS, NEURONS, device=DEVICE)
    g = torch.randn(STEPS, NEURONS, device=DEVICE)
    for name in ("noisy", "lif"):
        spec = spec_from_toml(NOISY_LIF) if name == "noisy" else load_spec("lif")
        config = NeuronConfig(spec, spec.surrogate, "hard", tensors=(("sigma", SHARED),) if name == "noisy" else ())
        params = {p.name: p.default for p in spec.params if p.kind != "tensor" and not p.learnable}
        if name == "noisy":
            params |= {"sigma": torch.full((1,), 0.2, device=DEVICE), "ac_seed_lo": 1.0, "ac_seed_hi": 2.0,
                       "ac_step0": 0.0}
        out = named_launch.forward(config, x, {"v": 0.0}, params, backend=BACKEND)
        saved = {"h_seq": out["h_seq"], "x_seq": x, "v_init": 0.0}
        for layout in LAYOUTS:
            def run(config=config, saved=saved, params=params, layout=layout):
                return named_launch.backward(config, {"grad_spike_seq": g}, saved, params, grad_finals=False,
                                             given_inits=False, backend=BACKEND, layout=layout)
            run()
            print(f"{name:6s} {layout}: " + (f"{median_us(run):.1f} us" if DEVICE == "cuda" else "ok"), flush=True)


if __name__ == "__main__":
    main()
