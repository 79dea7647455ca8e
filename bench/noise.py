"""A noisy LIF's kernels against the noiseless LIF's (issue 46: within 10% of its time), and the generator alone.

The noisy LIF is LIF with `sigma * randn()` in its charge (sigma learnable, docs/spec-format.md "Random draws"): the
kernels' time loop makes a Philox4x32-10 call every four steps (two in float64) and a normal of each step's word (in
float64 a Box-Muller transform every two) per neuron, forward and again in backward, and moves no more bytes than
LIF. Rows: inference (forward, no gradient) and training (forward + backward of the spikes), per dtype, at (T, N);
the ratio noisy / noiseless; and the generator's own rate making one draw per call (`noise.DrawKernel`: a Philox
call and a transform each; normal draws per second in float and double).

    python -m bench.noise [--steps 8] [--neurons 8388608] [--dtypes float32,bfloat16] [--quick] [--out DIR]

Timing as the main benchmark (`bench.measure.Clock`: CUDA events, L2 flushed, the median of repetitions).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import autocuda.nn as ann
from autocuda.codegen import noise
from autocuda.spec.load import load_spec, spec_from_toml

from .measure import Clock

NOISY_LIF = """
name = "noisy_lif"
doc = "LIF with a learnable noise scale in its charge"
charge = "v + (x - (v - v_reset)) / tau + sigma * randn()"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
sigma = { default = 0.2, learnable = true }
[states]
v = "v_reset"
"""


def layer_call(spec, dtype: torch.dtype, steps: int, neurons: int, training: bool):
    layer = ann.Neuron(spec, step_mode="m", backend="cuda").to("cuda")
    x = torch.rand(steps, neurons, device="cuda", dtype=dtype).requires_grad_(training)

    def call() -> None:
        layer.reset()
        if training:
            layer(x).sum().backward()
        else:
            with torch.no_grad():
                layer(x)
    return call


def draw_call(precision: str, count: int):
    kernel = noise.DrawKernel("normal", precision)
    out = torch.empty(count, dtype=noise.PRECISIONS[precision].torch_dtype, device="cuda")
    return lambda: kernel.simple_call(out=out, seed_lo=1, seed_hi=2, site=0, neuron0=0, step=0)


def run(steps: int, neurons: int, dtypes: list[str], quick: bool) -> dict:
    clock = Clock(torch.device("cuda"), quick)
    specs = {"lif": load_spec("lif"), "noisy_lif": spec_from_toml(NOISY_LIF)}
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for mode in ("inference", "training"):
            times = {name: clock.median(layer_call(spec, dtype, steps, neurons, mode == "training"))
                     for name, spec in specs.items()}
            rows.append({"dtype": dtype_name, "mode": mode, "steps": steps, "neurons": neurons,
                         "lif_ms": times["lif"], "noisy_lif_ms": times["noisy_lif"],
                         "ratio": times["noisy_lif"] / times["lif"]})
    generator = []
    for precision in ("float", "double"):
        count = steps * neurons
        ms = clock.median(draw_call(precision, count))
        generator.append({"precision": precision, "draws": count, "ms": ms, "draws_per_s": count / ms * 1e3})
    return {"device": torch.cuda.get_device_name(), "rows": rows, "generator": generator}


def table(result: dict) -> str:
    lines = [f"noisy LIF vs LIF on {result['device']} (target: ratio <= 1.10)",
             f"{'dtype':<10} {'mode':<10} {'T':>3} {'N':>9} {'lif ms':>9} {'noisy ms':>9} {'ratio':>6}"]
    lines += [f"{r['dtype']:<10} {r['mode']:<10} {r['steps']:>3} {r['neurons']:>9} {r['lif_ms']:>9.3f} "
              f"{r['noisy_lif_ms']:>9.3f} {r['ratio']:>6.3f}" for r in result["rows"]]
    lines += ["generator alone (normal draws, one a call: a Philox call and a transform each):"]
    lines += [f"  {g['precision']:<7} {g['draws']:>10} draws {g['ms']:>8.3f} ms  {g['draws_per_s'] / 1e9:.1f} G/s"
              for g in result["generator"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--neurons", type=int, default=8 << 20)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.noise times CUDA kernels: no GPU here")
    result = run(args.steps, args.neurons, args.dtypes.split(","), args.quick)
    print(table(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "noise.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
