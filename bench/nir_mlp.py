"""Training step of a NIR-imported spiking MLP: autocuda's `from_nir` against SpikingJelly 2.0's NIR import.

The graph: Affine(784 -> 1024) -> LIF -> Affine(1024 -> 1024) -> LIF -> Affine(1024 -> 10) -> LIF, built with
the `nir` package (LIF with tau = 2 dt, r = 1, v_leak = v_reset = 0, v_threshold = 1: SpikingJelly's
LIFNode(tau=2) as its exporter writes it). One step = forward over [T, B, 784], cross-entropy of the spike
counts, backward, SGD step. Systems:

- ours:    autocuda.nir.from_nir(graph): each LIF one fused kernel over T (forward and backward);
- sj-nir:  spikingjelly.activation_based.nir_exchange.import_from_nir(graph, step_mode='m');
- sj:      the same MLP written with SpikingJelly's layer.Linear and neuron.LIFNode(step_mode='m') directly;
- NAME+graph (ours+graph, sj-nir+graph, ...): that system's whole training step captured in a CUDA graph once
  and replayed (no host work per step); a capture that fails is reported as skipped with its error.

Precisions, the same for every system: fp32 (torch's default: no TF32 in matmuls), tf32 (TF32 matmuls allowed),
bf16 (torch.autocast to bfloat16 around forward and loss; the weights stay float32).

A step's time is the CUDA-event time from its start to its end, steps queued back to back (a host slower than
the GPU shows as gaps inside the steps); the median over --steps after --warmup steps. Before timing, each
system's output spikes are compared with the first system's on one forward (the agreement is printed; below
1 where rounding differs). `host ms` is the median time the host spends in one step's call (queueing its
work); where it exceeds the GPU's time per step, the step is host-bound. --profile also sums each system's GPU
kernel time per step by kind (matrix products, neuron kernels, the rest) over a few steps under
torch.profiler; --host-profile writes DIR/host_profile.txt, the Python functions that take the host's time
in 20 steps of each system (cProfile).

    python -m bench.nir_mlp --out DIR [--device cuda] [--steps 30] [--batch 256] [--time-steps 32]
        [--hidden 1024] [--systems ours,sj-nir,sj,ours+graph,sj-nir+graph] [--precisions fp32,tf32,bf16] [--profile]

Prints a table (`/ ours`: the system's median step time over ours in the same precision) and writes
DIR/nir_mlp.json. A system whose library is missing is reported as skipped.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

DT, INPUTS, CLASSES = 1e-4, 784, 10
PRECISIONS = ("fp32", "tf32", "bf16")
# GPU kernel kinds for --profile: the first whose words appear in a kernel's (lower-case) name
KERNEL_KINDS = (("matmul", ("gemm", "xmma", "cutlass", "cublas", "splitk", "nvjet")),
                ("neuron", ("fptt", "bptt", "lif", "_forward_kernel", "_backward_kernel")))


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
        from autocuda.tools.nir import from_nir

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


@contextlib.contextmanager
def precision(name: str, device: torch.device) -> Iterator[Callable[[], Any]]:
    """Sets the matmul precision for the block; yields the context to run forward and loss in."""
    if name not in PRECISIONS:
        raise ValueError(f"--precisions: unknown precision {name!r} (known: {', '.join(PRECISIONS)})")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    try:
        if name == "bf16":
            # no cast cache: each weight is cast once per step anyway, and a CUDA graph capture needs it off
            yield lambda: torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
        else:
            yield contextlib.nullcontext
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _reset(model: nn.Module) -> None:
    reset = getattr(model, "reset", None)
    if callable(reset):  # the model resets its own modules (ours: NIRModule.reset)
        reset()
        return
    for module in model.modules():
        if module is not model and hasattr(module, "reset"):
            module.reset()


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                  autocast: Callable[[], Any]) -> None:
    _reset(model)
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss = nn.functional.cross_entropy(model(x).float().mean(0), y)
    loss.backward()
    optimizer.step()


def step_function(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: Callable[[], Any],
                  graphed: bool) -> Callable[[], None]:
    """One training step on (x, y); `graphed`: the whole step captured once in a CUDA graph and replayed
    (torch's whole-network capture: eager steps on a side stream first, gradients allocated inside the graph)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if not graphed:
        return lambda: training_step(model, optimizer, x, y, autocast)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            training_step(model, optimizer, x, y, autocast)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        _reset(model)
        with autocast():
            loss = nn.functional.cross_entropy(model(x).float().mean(0), y)
        loss.backward()
        optimizer.step()
    return graph.replay


def time_system(step: Callable[[], None], steps: int, warmup: int, device: torch.device) -> dict[str, float]:
    cuda = device.type == "cuda"
    start = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times, host, wall = [], [], time.perf_counter()
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for begin, end in events:
            begin.record()
            start = time.perf_counter()
            step()
            host.append(1e3 * (time.perf_counter() - start))
            end.record()
        torch.cuda.synchronize(device)
        times = [begin.elapsed_time(end) for begin, end in events]
    else:
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - start))
        host = times
    wall_ms = 1e3 * (time.perf_counter() - wall) / steps
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else float("nan")
    return {"first_step_s": first, "median_step_ms": statistics.median(times), "min_step_ms": min(times),
            "wall_ms_per_step": wall_ms, "host_ms": statistics.median(host), "peak_mib": peak}


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(w in lower for w in words)), "other")


def profile_system(step: Callable[[], None], device: torch.device, steps: int = 5) -> dict[str, Any]:
    """GPU kernel time per step by kind, and the longest kernels (ms per step)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time_total / 1e3 / steps
            entry[1] += 1 / steps
    kinds = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for name, (ms, _) in kernels.items():
        kinds[kernel_kind(name)] += ms
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:6]
    return {"kernel_ms_per_step": kinds, "kernels_per_step": round(sum(n for _, n in kernels.values())),
            "top_kernels": [{"name": name[:90], "ms": ms, "calls": round(n)} for name, (ms, n) in top]}


def host_profile(step: Callable[[], None], steps: int = 20, lines: int = 25) -> str:
    """The functions with the most own host time over `steps` steps (cProfile), as text."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue()


def agreement(model: nn.Module, reference: torch.Tensor, x: torch.Tensor, autocast: Callable[[], Any]) -> float:
    _reset(model)
    with torch.no_grad(), autocast():
        return float((model(x).float() == reference).double().mean())


def run_system(system: str, graph: Any, precision_name: str, args: argparse.Namespace, device: torch.device,
               x: torch.Tensor, y: torch.Tensor, reference: torch.Tensor | None) -> tuple[dict[str, Any], Any]:
    """One row; `system` may end in '+graph': its training step replayed from a CUDA graph."""
    row: dict[str, Any] = {"system": system, "precision": precision_name}
    base, graphed = system.removesuffix("+graph"), system.endswith("+graph")
    if graphed and device.type != "cuda":
        return {**row, "skipped": "CUDA graphs need a CUDA device"}, reference
    try:
        model = build(base, graph, device)
    except ImportError as error:
        return {**row, "skipped": f"{type(error).__name__}: {error}"}, reference
    with precision(precision_name, device) as autocast:
        _reset(model)
        with torch.no_grad(), autocast():
            out = model(x).float()
        reference = out if reference is None else reference
        row["spike_agreement_with_first"] = agreement(model, reference, x, autocast)
        row["output_spike_rate"] = float(out.mean())
        try:
            step = step_function(model, x, y, autocast, graphed)
        except RuntimeError as error:  # a capture that fails is reported, not fatal
            return {**row, "skipped": f"capture failed: {str(error)[:300]}"}, reference
        row.update(time_system(step, args.steps, args.warmup, device))
        if args.host_profile:
            row["host_profile"] = host_profile(step)
        if args.profile and device.type == "cuda":
            try:
                row["profile"] = profile_system(step, device)
            except (RuntimeError, AttributeError) as error:  # the profiler's API differs between torch versions
                row["profile_error"] = f"{type(error).__name__}: {error}"
    return row, reference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for nir_mlp.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per system and precision")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--time-steps", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--systems", default="ours,sj-nir,sj")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32, tf32, bf16 (comma-separated)")
    parser.add_argument("--profile", action="store_true", help="also sum GPU kernel time per step by kind")
    parser.add_argument("--host-profile", action="store_true", help="also write host_profile.txt (cProfile)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    graph = make_graph(args.hidden)
    x = torch.rand(args.time_steps, args.batch, INPUTS, device=device)
    y = torch.randint(0, CLASSES, (args.batch,), device=device)
    rows: list[dict[str, Any]] = []
    for precision_name in args.precisions.split(","):
        reference = None
        for system in args.systems.split(","):
            row, reference = run_system(system, graph, precision_name, args, device, x, y, reference)
            rows.append(row)
    report(rows, args, device)
    return 0


def report(rows: list[dict[str, Any]], args: argparse.Namespace, device: torch.device) -> None:
    head = f"NIR MLP 784-{args.hidden}-{args.hidden}-10, T={args.time_steps}, batch {args.batch}, {device}"
    print(head)
    print(f"{'precision':9} {'system':12} {'median ms':>10} {'min ms':>8} {'host ms':>8} {'first s':>8} "
          f"{'peak MiB':>9} {'agree':>6} {'/ ours':>7}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['precision']:9} {r['system']:12} skipped: {r['skipped']}")
            continue
        ours = next((o for o in rows if o["system"] == "ours" and o["precision"] == r["precision"]
                     and "median_step_ms" in o), None)
        ratio = r["median_step_ms"] / ours["median_step_ms"] if ours else float("nan")
        print(f"{r['precision']:9} {r['system']:12} {r['median_step_ms']:10.3f} {r['min_step_ms']:8.3f} "
              f"{r['host_ms']:8.3f} {r['first_step_s']:8.2f} {r['peak_mib']:9.1f} "
              f"{r['spike_agreement_with_first']:6.3f} {ratio:6.2f}x")
    for r in rows:
        if "profile" in r:
            kinds = ", ".join(f"{k} {v:.3f}" for k, v in r["profile"]["kernel_ms_per_step"].items())
            print(f"{r['precision']:9} {r['system']:12} GPU ms per step: {kinds}; "
                  f"{r['profile']['kernels_per_step']} kernels")
            for kernel in r["profile"]["top_kernels"]:
                print(f"{'':23} {kernel['ms']:7.3f} ms  x{kernel['calls']:<3} {kernel['name']}")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "nir_mlp", "title": head, "device": device_name, "torch": torch.__version__,
              "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "rows": rows}
    profiles = [f"== {r['precision']} {r['system']}: 20 steps\n{r.pop('host_profile')}" for r in rows
                if "host_profile" in r]
    if profiles:
        (args.out / "host_profile.txt").write_text("\n".join(profiles))
    (args.out / "nir_mlp.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
