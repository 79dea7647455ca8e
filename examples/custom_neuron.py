#!/usr/bin/env python
"""A new neuron model from a TOML spec written here: generate its CUDA, check it, train with it.

The model is a LIF neuron with a dynamic threshold: every spike raises the threshold by `delta`, and the
raise decays back with time constant `tau_th`. Its membrane time constant is learnable, and its surrogate
gradient is a user expression (a triangle of half-width `width`).

Steps:
  1. write the spec to a temporary .toml file and load it (`autocuda.load_spec`);
  2. print its generated FPTT kernel (`autocuda.source`);
  3. run the generated kernels on the CPU through the host runner and compare them with the float64
     reference (`autocuda.testing.check_spec(..., backend="host")`; needs a C++ compiler);
  4. use it as a layer (`autocuda.nn.Neuron`) and take one gradient step.

    python examples/custom_neuron.py             # all of the above
    python examples/custom_neuron.py --no-check  # skip step 3 (no C++ compiler needed)
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import autocuda
from autocuda.nn import Neuron
from autocuda.tools.testing import check_spec

SPEC = '''
name = "dtlif"
doc = "LIF with a dynamic threshold: each spike raises it by delta, the raise decays with tau_th"
charge = "v + (x - (v - v_reset)) / tau"
threshold = "v_threshold + theta"
reset = "hard"

[params]
tau = { default = 2.0, kind = "tensor", learnable = true, doc = "membrane time constant (learned)" }
tau_th = { default = 10.0, doc = "time constant of the threshold's decay, in steps" }
delta = { default = 0.3, doc = "threshold raise per spike" }
v_threshold = 1.0
v_reset = 0.0

[states]
v = "v_reset"       # the first state is the membrane
theta = 0.0         # the threshold's raise above v_threshold

[derived]
decay_th = "exp(-1 / tau_th)"

[updates]
theta = "decay_th * theta + delta * s"

[surrogate]
gradient = "max(0, 1 - abs(x) / width) / width"
width = 1.0
'''


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-check", action="store_true", help="skip the host-runner check (step 3)")
    parser.add_argument("--dtypes", default="float32,float16", help="dtypes to check (comma-separated)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dtlif.toml"
        path.write_text(SPEC)
        spec = autocuda.load_spec(path)  # errors name the file, the field and the symbol
    print(f"loaded {spec.name!r}: {spec.doc}")
    print(f"  params: {', '.join(p.name for p in spec.params)}; states: {', '.join(s.name for s in spec.states)}; "
          f"surrogate: {spec.surrogate!r}\n")

    print(autocuda.source(spec, "fptt", "float32"))

    if not args.no_check:
        start = time.perf_counter()
        report = check_spec(spec, backend="host", dtypes=args.dtypes.split(","), examples=2)
        print(f"host check: {report.summary()} ({time.perf_counter() - start:.1f} s)")
        report.raise_on_failure()

    torch.manual_seed(0)
    # tau becomes an nn.Parameter (learnable = true). Modules default to SpikingJelly's Sigmoid surrogate:
    # pass the spec's own to use it.
    layer = Neuron(spec, surrogate_function=spec.surrogate, step_mode="m")
    optimizer = torch.optim.SGD(layer.parameters(), lr=10.0)
    x_seq = 1.5 * torch.rand(16, 4, 8)                   # [T, batch, neurons]
    spikes = layer(x_seq)
    print(f"\nspikes per neuron over {x_seq.shape[0]} steps (first sample): {spikes[:, 0].sum(0).tolist()}")
    print(f"final threshold raise (first sample): {[round(v, 3) for v in layer.theta[0].tolist()]}")
    loss = (spikes.mean() - 0.25) ** 2                   # push the mean firing rate towards 0.25
    loss.backward()
    before = float(layer.tau.detach())
    optimizer.step()
    layer.reset()                                        # back to v = v_reset, theta = 0
    print(f"rate {spikes.detach().mean().item():.3f}; d(loss)/d(tau) = {float(layer.tau.grad):.4f}; "
          f"one SGD step moves tau from {before:.3f} to {float(layer.tau.detach()):.3f}")

if __name__ == "__main__":
    main()
