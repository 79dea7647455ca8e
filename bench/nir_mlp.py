"""Training step of a NIR-imported spiking MLP: autocuda's `from_nir` against SpikingJelly 2.0's NIR import.

The graph: Affine(784 -> 1024) -> LIF -> Affine(1024 -> 1024) -> LIF -> Affine(1024 -> 10) -> LIF, built with
the `nir` package (LIF with tau = 2 dt, r = 1, v_leak = v_reset = 0, v_threshold = 1: SpikingJelly's
LIFNode(tau=2) as its exporter writes it). One step = forward over [T, B, 784], cross-entropy of the spike
counts, backward, SGD step. Systems:

- ours:    autocuda.nir.from_nir(graph): each LIF one fused kernel over T (forward and backward);
- sj-nir:  spikingjelly.activation_based.nir_exchange.import_from_nir(graph, step_mode='m');
- sj:      the same MLP written with SpikingJelly's layer.Linear and neuron.LIFNode(step_mode='m') directly.

Before timing, each system's output spikes are compared with ours on one forward (the agreement is printed).

    python bench/nir_mlp.py --out DIR [--device cuda] [--steps 20] [--batch 256] [--time-steps 32]
        [--hidden 1024] [--systems ours,sj-nir,sj]

Prints a table (`/ ours`: the system's median step time over ours) and writes DIR/nir_mlp.json. A system whose
library is missing is reported as skipped.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

DT, INPUTS, CLASSES = 1e-4, 784, 10


def make_graph(hidden: int, seed: int = 0) -> Any:
    import nir

    rng = np.random.default_rng(seed)
    sizes = (INPUTS, hidden, hidden, CLASSES)
    nodes: list[Any] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        bound = 2.5 / np.sqrt(n_in)  # wide enough that every layer spikes
        nodes.append(nir.Affine(weight=rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32),
                                bias=rng.uniform(0, bound, n_out).astype(np.float32)))
        nodes.append(nir.LIF(tau=np.full(n_out, 2 * DT), r=np.ones(n_out), v_leak=np.zeros(n_out),
                             v_threshold=np.ones(n_out), v_reset=np.zeros(n_out)))
    return nir.NIRGraph.from_list(*nodes)


class _SJImported(nn.Module):
    """SpikingJelly's imported graph returns (output, state); a fresh state for each sequence."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x, None)[0]


def build(system: str, graph: Any, device: torch.device) -> nn.Module:
    if system == "ours":
        from autocuda.nir import from_nir

        return from_nir(graph, dt=DT).to(device)
    if system == "sj-nir":
        from spikingjelly.activation_based.nir_exchange import import_from_nir

        return _SJImported(import_from_nir(graph, dt=DT, device=str(device), step_mode="m"))
    if system == "sj":
        from spikingjelly.activation_based import layer, neuron

        modules: list[nn.Module] = []
        for node in graph.nodes.values():
            if type(node).__name__ == "Affine":
                linear = layer.Linear(node.weight.shape[1], node.weight.shape[0], step_mode="m")
                linear.weight.data, linear.bias.data = torch.as_tensor(node.weight), torch.as_tensor(node.bias)
                modules.append(linear)
            elif type(node).__name__ == "LIF":
                modules.append(neuron.LIFNode(tau=2.0, step_mode="m"))
        return nn.Sequential(*modules).to(device)
    raise ValueError(f"--systems: unknown system {system!r} (known: ours, sj-nir, sj)")


def _reset(model: nn.Module) -> None:
    for module in model.modules():
        if module is not model and hasattr(module, "reset"):
            module.reset()


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    _reset(model)
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x).mean(0), y)
    loss.backward()
    optimizer.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_system(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int,
                device: torch.device) -> dict[str, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    training_step(model, optimizer, x, y)
    _sync(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        training_step(model, optimizer, x, y)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        training_step(model, optimizer, x, y)
        _sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return {"first_step_s": first, "median_step_ms": 1e3 * statistics.median(times),
            "min_step_ms": 1e3 * min(times), "peak_mib": peak}


def agreement(model: nn.Module, reference: torch.Tensor, x: torch.Tensor) -> float:
    _reset(model)
    with torch.no_grad():
        return float((model(x) == reference).double().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for nir_mlp.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per system")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--time-steps", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--systems", default="ours,sj-nir,sj")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    graph = make_graph(args.hidden)
    x = torch.rand(args.time_steps, args.batch, INPUTS, device=device)
    y = torch.randint(0, CLASSES, (args.batch,), device=device)
    rows: list[dict[str, Any]] = []
    reference: torch.Tensor | None = None
    for system in args.systems.split(","):
        row: dict[str, Any] = {"system": system}
        try:
            model = build(system, graph, device)
        except ImportError as error:
            rows.append({**row, "skipped": f"{type(error).__name__}: {error}"})
            continue
        _reset(model)
        with torch.no_grad():
            out = model(x)
        reference = out if reference is None else reference
        row["spike_agreement_with_first"] = agreement(model, reference, x)
        row["output_spike_rate"] = float(out.mean())
        row.update(time_system(model, x, y, args.steps, args.warmup, device))
        rows.append(row)
    report(rows, args, device)
    return 0


def report(rows: list[dict[str, Any]], args: argparse.Namespace, device: torch.device) -> None:
    head = f"NIR MLP 784-{args.hidden}-{args.hidden}-10, T={args.time_steps}, batch {args.batch}, float32, {device}"
    print(head)
    print(f"{'system':8} {'median ms':>10} {'min ms':>8} {'first s':>8} {'peak MiB':>9} {'agree':>6} {'/ ours':>7}")
    ours = next((r for r in rows if r["system"] == "ours" and "median_step_ms" in r), None)
    for r in rows:
        if "skipped" in r:
            print(f"{r['system']:8} skipped: {r['skipped']}")
            continue
        ratio = r["median_step_ms"] / ours["median_step_ms"] if ours else float("nan")
        print(f"{r['system']:8} {r['median_step_ms']:10.3f} {r['min_step_ms']:8.3f} {r['first_step_s']:8.2f} "
              f"{r['peak_mib']:9.1f} {r['spike_agreement_with_first']:6.3f} {ratio:6.2f}x")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "nir_mlp", "title": head, "device": device_name, "torch": torch.__version__,
              "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "rows": rows}
    (args.out / "nir_mlp.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
