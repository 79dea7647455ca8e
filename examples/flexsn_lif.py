"""SpikingJelly 2.0's FlexSN example core, trained with autocuda's FlexSN.

`lif_core_sg` is the core of SpikingJelly's `train_flexsn_compile.py`, written as SpikingJelly writes it: a
pure PyTorch step over Python numbers whose spike is a SpikingJelly surrogate module. `autocuda.nn.FlexSN` takes
the same function object: it traces the core into a neuron spec (the printed equations), and runs that spec's
generated kernels on a GPU (on a CPU, the spec's torch reference; `--backend host` runs the generated CUDA on
the CPU). The task: a small network learns to tell two spike-rate patterns apart, in a few seconds on a CPU.

    python examples/flexsn_lif.py              # CPU, reference backend
    python examples/flexsn_lif.py --backend host --steps 20
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from autocuda.nn import FlexSN


def make_core(alpha: float):
    """SpikingJelly's example core: the surrogate is captured by the step, as its example passes it."""
    from spikingjelly.activation_based import surrogate

    sg = surrogate.Sigmoid(alpha=alpha)

    def lif_core_sg(x: torch.Tensor, v: torch.Tensor):
        tau, v_th = 2.0, 1.0
        h = v + (x - v) / tau
        s = sg(h - v_th)
        return s, h * (1.0 - s)

    return lif_core_sg


def data(batch: int, steps: int, features: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes of Bernoulli spike trains: class 1 fires more on the first half of the features."""
    labels = torch.randint(0, 2, (batch,), generator=generator)
    rates = torch.full((batch, features), 0.2)
    rates[labels == 1, : features // 2] = 0.6
    rates[labels == 0, features // 2:] = 0.6
    spikes = torch.bernoulli(rates.expand(steps, batch, features), generator=generator)
    return spikes, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--backend", default=None, help="None (kernels on CUDA, reference on CPU), host, reference")
    parser.add_argument("--alpha", type=float, default=4.0, help="the Sigmoid surrogate's alpha")
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    core = make_core(args.alpha)
    hidden = FlexSN(core, num_states=1, backend=args.backend)  # step_mode "m": [T, batch, features]
    print("traced spec:", hidden.spec.charge, "| threshold", hidden.spec.threshold, "| reset", hidden.spec.reset)
    model = nn.ModuleDict({"fc1": nn.Linear(16, 32), "fc2": nn.Linear(32, 2)})
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    start = time.perf_counter()
    for step in range(args.steps):
        x, labels = data(64, 8, 16, generator)
        hidden.reset()
        spikes = hidden(model["fc1"](x) * 2.0)
        logits = model["fc2"](spikes.mean(0))
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    with torch.no_grad():
        x, labels = data(512, 8, 16, generator)
        hidden.reset()
        accuracy = (model["fc2"](hidden(model["fc1"](x) * 2.0).mean(0)).argmax(1) == labels).float().mean()
    print(f"test accuracy {accuracy.item():.3f} after {args.steps} steps ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
