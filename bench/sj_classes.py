"""SpikingJelly 2.0's newer neuron classes against ours (issue 46's speed target), one training step each at
(T, N) = (8, 8M) by default, in float32 and bfloat16, on one GPU, in one run:
`python -m bench.sj_classes [--device cuda] [--steps 8] [--neurons 8388608] [--reps 20] [--classes A,B]`, or
`python -m bench --parts sj-classes`. `--device cpu --neurons 4096 --reps 1` runs the logic only.

Each class is built the same way in both libraries: the same constructor arguments (each library's own default
surrogate), built after the same seeds, our parameters and buffers loaded from SpikingJelly's layer's state_dict
where both have them. A training step is the call and `.sum().backward()` of its output; STBIF, which trains
neither, is a forward under `torch.no_grad()`. The input has about N neurons per step in the class's natural
shape: [T, N] for most; [T, 32, 64, H, W] for the per-channel classes (MPBN's BatchNorm2d, GLIF); the noisy
nodes [T, N / 256, num_node = 256]; the inter-layer-connection nodes [T, N / 128, act_dim * dec_pop_dim = 8 * 16];
the few-spike nodes [K = T, N] (step mode 'm': the gate is the sum of the K inputs).

Outside the timed region, before every call: the layer's reset, its gradients dropped, the input's too. The noisy
nodes get one episode of noise, made once by our `reset_noise(1)` in the run's dtype on the device and given to
both layers (their `noise_step` set back before each call, so each call takes that episode): SpikingJelly's
would otherwise keep its episodes on the CPU and move one step of noise per step. SpikingJelly's ILC nodes add
their feedback into the input in place, so every ILC call of both libraries takes a fresh copy of the input,
made outside the timed region. The online nodes (OTTT, SLTT) are timed as their users train them: T single
steps, each with its own backward (OTTT's spike, not its trace, is the output), from per-step input leaves.

Times are the median over `--reps` calls (wall time, synchronised on a GPU) after two warm-up calls; the peak
memory of a call (on a GPU) is in each row. A class that cannot run at that size or dtype in one library (an
error, out of memory) is a row saying why (`skipped: ...`) for that library; the run goes on.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import autocuda.nn as our

CHANNELS = 64  # the per-channel classes' inputs are [T, B, C, H, W] with C = 64 and H = W (BatchNorm2d, GLIF)
BATCH = 32  # their batch
NUM_NODE = 256  # the noisy nodes' neurons per sample (their noise is one value per neuron and step)
ACT_DIM, DEC_POP_DIM = 8, 16  # the inter-layer-connection nodes' populations: 128 neurons per sample
WARMUP = 2  # calls before timing: the first compiles and allocates
TRAINING, FORWARD, ONLINE = "training", "forward", "online"
AGREE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}  # float32: 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
    """One class: how to build it from a module of classes (autocuda.nn or SpikingJelly's neuron), its input's
    shape for (T, N), how a step is timed, the noise episodes both layers share, and whether each call takes a
    fresh copy of the input."""
    build: Callable[[Any], torch.nn.Module]
    shape: Callable[[int, int], tuple[int, ...]]
    kind: str = TRAINING
    noise: tuple[str, ...] = ()
    fresh_input: bool = False


def flat(steps: int, neurons: int) -> tuple[int, ...]:
    return steps, neurons


def per_channel(steps: int, neurons: int) -> tuple[int, ...]:
    side = max(1, int((neurons // (CHANNELS * BATCH)) ** 0.5))
    return steps, BATCH, CHANNELS, side, side


def per_sample(width: int) -> Callable[[int, int], tuple[int, ...]]:
    return lambda steps, neurons: (steps, max(1, neurons // width), width)


def tables(module: Any, steps: int, scales: Sequence[float]) -> list[Any]:
    """Few-spike tables of K = `steps`: thresholds and decrements scale·2^-k, output weights the same."""
    halves = 2.0 ** -torch.arange(steps, dtype=torch.float32)
    return [module.FewSpikeTable(scale * halves, scale * halves, scale * halves) for scale in scales]


def cases(steps: int) -> dict[str, Case]:
    """Every class of issue 46 that autocuda has, by name."""
    noisy = per_sample(NUM_NODE)
    ilc = per_sample(ACT_DIM * DEC_POP_DIM)
    return {
        "DSRIFNode": Case(lambda m: m.DSRIFNode(T=steps, v_threshold=1.0), flat),
        "DSRLIFNode": Case(lambda m: m.DSRLIFNode(T=steps), flat),
        "STBIFNode": Case(lambda m: m.STBIFNode(0.5, 8, sym=True, step_mode="m"), flat, FORWARD),
        "ActivationAwareIFNode": Case(lambda m: m.ActivationAwareIFNode(0.75, 0.25, step_mode="m"), flat),
        "MPBNLIFNode": Case(lambda m: m.MPBNLIFNode(out_channels=CHANNELS, step_mode="m"), per_channel),
        "GatedLIFNode": Case(lambda m: m.GatedLIFNode(T=steps, inplane=CHANNELS), per_channel),
        "PSN": Case(lambda m: m.PSN(T=steps), flat),
        "MaskedPSN": Case(lambda m: m.MaskedPSN(k=4, T=steps, step_mode="m"), flat),
        "SlidingPSN": Case(lambda m: m.SlidingPSN(k=4, step_mode="m"), flat),
        "NoisyCUBALIFNode": Case(lambda m: m.NoisyCUBALIFNode(NUM_NODE, T=steps), noisy,
                                 noise=("eps_v_seq", "eps_s_seq")),
        "NoisyNonSpikingIFNode": Case(lambda m: m.NoisyNonSpikingIFNode(NUM_NODE, T=steps, decode="mean-mem"),
                                      noisy, noise=("eps_seq",)),
        "NoisyILCCUBALIFNode": Case(lambda m: m.NoisyILCCUBALIFNode(ACT_DIM, DEC_POP_DIM, T=steps), ilc,
                                    noise=("eps_v_seq", "eps_s_seq")),
        "ILCIFNode": Case(lambda m: m.ILCIFNode(ACT_DIM, DEC_POP_DIM), ilc, fresh_input=True),
        "ILCLIFNode": Case(lambda m: m.ILCLIFNode(ACT_DIM, DEC_POP_DIM), ilc, fresh_input=True),
        "ILCCUBALIFNode": Case(lambda m: m.ILCCUBALIFNode(ACT_DIM, DEC_POP_DIM), ilc, fresh_input=True),
        "FewSpikeNode": Case(lambda m: m.FewSpikeNode(*tables(m, steps, [4.0]), step_mode="m"), flat),
        "HGNode": Case(lambda m: m.HGNode(tables(m, steps, [1.0, 4.0, 16.0]), [0.0, 4.0], step_mode="m"), flat),
        "OutlierAwareThresholdNode": Case(lambda m: m.OutlierAwareThresholdNode(
            *tables(m, steps, [4.0, 16.0]), split_threshold=4.0, clamp_value=16.0, step_mode="m"), flat),
        "OTTTLIFNode": Case(lambda m: m.OTTTLIFNode(), flat, ONLINE),
        "SLTTLIFNode": Case(lambda m: m.SLTTLIFNode(), flat, ONLINE),
    }


def copy_shared_state(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Our parameters and buffers set to SpikingJelly's where both have one of that name and shape."""
    mine = ours.state_dict()
    shared = {k: v for k, v in theirs.state_dict().items() if k in mine and mine[k].shape == v.shape}
    ours.load_state_dict(shared, strict=False)


def noise_episodes(case: Case, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """One episode of each noise the case's layers read, made by our layer's `reset_noise` from a fixed seed."""
    if not case.noise:
        return {}
    maker: Any = case.build(our)
    maker.reset_noise(1, random_state=0)
    return {name: getattr(maker, name).to(device, dtype) for name in case.noise}


def _output(y: Any) -> torch.Tensor:
    """The tensor a step's loss is taken of: OTTT's spike of [spike, trace]."""
    return y[0] if isinstance(y, (list, tuple)) else y


def step_call(layer: Any, case: Case, x: torch.Tensor,
              noise: dict[str, torch.Tensor]) -> tuple[Callable[[], None], Callable[[], torch.Tensor]]:
    """(prepare, call): `prepare` (not timed) resets the layer, drops gradients and sets up the input and noise;
    `call` is one timed step, returning its output (detached; the online nodes' last step's)."""
    for name, episode in noise.items():
        setattr(layer, name, episode)
    online = case.kind == ONLINE
    leaves = [x[t].clone().requires_grad_(True) for t in range(x.shape[0])] if online else []
    leaf = x if online else x.clone().requires_grad_(case.kind == TRAINING)
    given: list[torch.Tensor] = []

    def prepare() -> None:
        if hasattr(layer, "reset"):
            layer.reset()
        if noise:
            layer.noise_step = -1  # each call takes the one episode
        layer.zero_grad(set_to_none=True)
        for tensor in (*leaves, *([] if online else [leaf])):
            tensor.grad = None
        given[:] = [leaf.clone() if case.fresh_input else leaf]

    def call() -> torch.Tensor:
        if case.kind == FORWARD:
            with torch.no_grad():
                return _output(layer(given[0]))
        for x_t in leaves or given:
            y = _output(layer(x_t))
            y.sum().backward()
        return y.detach()

    return prepare, call


def median_time(prepare: Callable[[], None], call: Callable[[], torch.Tensor], reps: int,
                device: str) -> tuple[float, torch.Tensor]:
    """The median seconds of `call` over `reps` calls after WARMUP, each after `prepare` (not timed), and the
    first call's output."""
    times: list[float] = []
    outputs: list[torch.Tensor] = []
    for rep in range(reps + WARMUP):
        prepare()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        output = call()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if rep >= WARMUP:
            times.append(time.perf_counter() - start)
        outputs = outputs or [output]
    return statistics.median(times), outputs[0]


def measure(layer: torch.nn.Module, case: Case, x: torch.Tensor, noise: dict[str, torch.Tensor], reps: int,
            device: str) -> tuple[dict[str, float], torch.Tensor]:
    """({"ms": median ms of a step, "peak_mib": its peak memory above the start (GPU only)}, the first call's
    output)."""
    prepare, call = step_call(layer, case, x, noise)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    seconds, output = median_time(prepare, call, reps, device)
    row = {"ms": seconds * 1e3}
    if cuda:
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    return row, output


def _skipped(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200] if str(error).strip() else ''}"


def _build(case: Case, module: Any, device: str, dtype: torch.dtype) -> torch.nn.Module:
    np.random.seed(0)  # both libraries' layers from the same seeds (GLIF draws its initial gates with numpy)
    torch.manual_seed(1)
    return case.build(module).to(device, dtype)


def measure_class(name: str, case: Case, theirs: Any, steps: int, neurons: int, reps: int, device: str,
                  dtype_name: str) -> dict[str, Any]:
    """One row: both libraries' times for the class in one dtype; a library that fails says why instead.
    `theirs`: SpikingJelly's neuron module, or why there is none (a string)."""
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    x = (torch.randn(case.shape(steps, neurons), device=device) + 0.5).to(dtype)
    row: dict[str, Any] = {"class": name, "dtype": dtype_name, "kind": case.kind, "T": steps,
                           "N": x[0].numel(), "shape": list(x.shape)}
    layers: dict[str, torch.nn.Module] = {}
    outputs: dict[str, torch.Tensor] = {}
    for system, module in (("sj", theirs), ("ours", our)):
        if isinstance(module, str):
            row[f"{system}_skipped"] = module
            continue
        try:
            layer = layers[system] = _build(case, module, device, dtype)
            if "sj" in layers and system == "ours":
                copy_shared_state(layer, layers["sj"])
            noise = noise_episodes(case, dtype, device)
            figures, outputs[system] = measure(layer, case, x, noise, reps, device)
            row.update({f"{system}_{k}": v for k, v in figures.items()})
        except Exception as error:  # noqa: BLE001 - too large, a dtype it cannot run: a row saying why
            row[f"{system}_skipped"] = _skipped(error)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    if "sj_ms" in row and "ours_ms" in row:
        row["speedup"] = row["sj_ms"] / row["ours_ms"]
        row["agreement"] = agreement(outputs["sj"], outputs["ours"])
    if device.startswith("cuda"):  # the next row starts from an empty cache: no row times another's allocations
        layers.clear()
        outputs.clear()
        torch.cuda.empty_cache()
    return row


def agreement(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    """The fraction of output elements where the first calls agree (rtol = atol = AGREE_TOL of the dtype): a check
    that both layers were built alike, not a test (half precision's rounding flips a spike now and then)."""
    if theirs.shape != ours.shape:
        return 0.0
    tol = AGREE_TOL.get(ours.dtype, 1e-4)
    return float(torch.isclose(ours.float(), theirs.float(), rtol=tol, atol=tol).float().mean())


def spikingjelly() -> Any:
    """SpikingJelly's neuron module, or why it is missing (a string)."""
    try:
        from spikingjelly.activation_based import neuron
    except Exception as error:  # noqa: BLE001 - not installed, or a dependency missing: every row says so
        return f"SpikingJelly not importable ({_skipped(error)})"
    return neuron


def run(steps: int, neurons: int, reps: int, device: str, dtypes: Sequence[str], names: Sequence[str] | None = None,
        peers: bool = True, progress: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    """A row per class (all of `cases`, or `names`) and dtype."""
    known = cases(steps)
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise ValueError(f"unknown class {', '.join(unknown)} (known: {', '.join(known)})")
    theirs = spikingjelly() if peers else "--no-peers"
    rows = []
    for name in names or list(known):
        for dtype_name in dtypes:
            rows.append(measure_class(name, known[name], theirs, steps, neurons, reps, device, dtype_name))
            progress(rows[-1])
    return rows


KIND_NOTE = {FORWARD: " (forward)", ONLINE: " (T steps)", TRAINING: ""}


def describe(rows: Sequence[dict[str, Any]]) -> str:
    """The table's caption."""
    steps = sorted({r["T"] for r in rows})
    return ("SpikingJelly 2.0's newer classes against ours (bench/sj_classes.py): median ms of a training step, "
            f"forward and backward (STBIF: a forward; OTTT, SLTT: T single steps with their backward), T = "
            f"{', '.join(map(str, steps))}, N neurons per step; agree: the first calls' outputs that agree")


def format_table(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    """The rows as a table: each library's median ms (or why it has none), SpikingJelly's over ours, and how many
    of the first calls' outputs agree."""
    lines = [f"{'class':36} {'dtype':9} {'N':>8} {'SpikingJelly ms':>16} {'autocuda ms':>12} {'speed-up':>9} "
             f"{'agree':>7}"] if header else []
    for r in rows:
        cells = [f"{r['sj_ms']:16.3f}" if "sj_ms" in r else f"{'–':>16}",
                 f"{r['ours_ms']:12.3f}" if "ours_ms" in r else f"{'–':>12}",
                 f"{r['speedup']:8.2f}x" if "speedup" in r else f"{'–':>9}",
                 f"{r['agreement']:7.2%}" if "agreement" in r else f"{'–':>7}"]
        line = f"{r['class'] + KIND_NOTE[r['kind']]:36} {r['dtype']:9} {r['N']:>8} {' '.join(cells)}"
        reasons = [f"{who} skipped: {r[key]}" for who, key in (("SJ", "sj_skipped"), ("ours", "ours_skipped"))
                   if key in r]
        lines.append(line + ("  " + "; ".join(reasons) if reasons else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--neurons", type=int, default=8 << 20)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--classes", default=None, help="comma-separated class names (default: every class)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.classes.split(",") if n.strip()] if args.classes else None
    print(format_table([]), end="", flush=True)
    rows = run(args.steps, args.neurons, args.reps, args.device, args.dtypes.split(","), names,
               progress=lambda row: print(format_table([row], header=False), end="", flush=True))
    return 1 if any("ours_skipped" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
