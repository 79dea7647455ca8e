"""Whole-network training step: a CIFAR-sized spiking VGG with each system's LIF neuron, one SGD step per call.

Model: four Conv3x3-BatchNorm2d-LIF blocks (64-128-256-256 channels), 2x2 average pooling after blocks 2-4,
T folded into the batch for convolution and BatchNorm, a Linear head on the time-mean. One step = forward,
cross-entropy, backward, `optimizer.step()`. Per system, precision and (T, B): the first step's wall time
(compilation included), the median step time by CUDA events, the wall time per step, and the peak memory.

    python -m bench.network --out DIR [--systems ours,ours-compiled,...] [--shapes 4x64,16x32]
        [--precisions float32,bfloat16] [--steps 20] [--device cuda]

Systems: ours (autocuda LIFNode, eager), ours-compiled (the same model under torch.compile), ours-fused (BatchNorm
folded into the neuron: `fuse_batchnorm`), `-rc` after ours or ours-fused (the neurons with `recompute=True`), `-nf`
there or before `-rc` (`store_final_states=False`: the neurons keep no states after a call, which every step resets
anyway), `-rp` after `-nf` (also `save_h=False`: backward replays h from x), loop (a plain PyTorch LIF loop, eager),
loop-compiled (torch.compile of the model with that loop), sj (SpikingJelly 2.0 LIFNode), sj-flexsn (SpikingJelly
2.0 FlexSN). A `-ro` suffix compiles with mode="reduce-overhead" (CUDA graphs) instead of the default mode; each row
names its mode. A `-cl` suffix on any system (last) runs the model and its input in torch.channels_last. A system
whose library is missing is reported as skipped with the reason. Rows are written to network.json as they come. The
peak memory counts everything the row allocates from building the model on (compilation's buffers and CUDA graph
pools included).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

TAU, V_TH, ALPHA = 2.0, 1.0, 4.0
CHANNELS = (64, 128, 256, 256)
WARMUP = 3  # untimed training steps after the first (timed alone as first_step_s), before the timed ones


class SigmoidSpike(torch.autograd.Function):
    """Heaviside forward, the sigmoid surrogate's derivative (alpha = 4) backward."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return (z >= 0).to(z.dtype)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        sg = torch.sigmoid(ALPHA * z)
        return grad * ALPHA * sg * (1 - sg)


class LoopLIF(nn.Module):
    """LIF (tau = 2, hard reset to 0, decay_input) as a Python loop over T of torch ops: x [T, *]."""

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        v = torch.zeros_like(x_seq[0])
        spikes = []
        for x in x_seq:
            h = v + (x - v) / TAU
            s = SigmoidSpike.apply(h - V_TH)
            v = h * (1 - s)
            spikes.append(s)
        return torch.stack(spikes)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, neuron: nn.Module, pool: bool):
        super().__init__()
        self.conv, self.bn, self.neuron = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), neuron
        self.pool = nn.AvgPool2d(2) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, B, C, H, W]
        T, B = x.shape[:2]
        y = self.bn(self.conv(x.flatten(0, 1)))
        s = self.neuron(y.reshape(T, B, *y.shape[1:]))
        return self.pool(s.flatten(0, 1)).reshape(T, B, *self.pool(s[0]).shape[1:])


class SpikingVGG(nn.Module):
    def __init__(self, make_neuron: Callable[[], nn.Module], classes: int = 10):
        super().__init__()
        widths = (3, *CHANNELS)
        self.blocks = nn.Sequential(*(Block(widths[i], widths[i + 1], make_neuron(), pool=i > 0)
                                      for i in range(len(CHANNELS))))
        self.head = nn.Linear(CHANNELS[-1] * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, B, 3, 32, 32]
        return self.head(self.blocks(x).mean(0).flatten(1))


def _reset(model: nn.Module) -> None:
    for m in model.modules():
        if m is not model and hasattr(m, "reset") and callable(m.reset):
            m.reset()


def _sj():
    from spikingjelly.activation_based import neuron, surrogate

    return neuron, surrogate


def _sj_flexsn() -> nn.Module:
    neuron, surrogate = _sj()
    spike = surrogate.sigmoid.apply  # FlexSN refuses a core that captures a module (a surrogate object)

    def lif_core(x, v):
        h = v + (x - v) / TAU
        s = spike(h - V_TH, ALPHA)
        return s, h * (1.0 - s)

    return neuron.FlexSN(core=lif_core, num_states=1, step_mode="m")


def _ours() -> nn.Module:
    from autocuda.nn import LIFNode

    return LIFNode(tau=TAU, step_mode="m")


def _ours_recompute() -> nn.Module:
    layer = _ours()
    layer.recompute = True  # backward runs the forward again instead of keeping h
    return layer


def _ours_no_finals() -> nn.Module:
    layer = _ours()
    layer.store_final_states = False  # a multi-step call keeps no states (each batch starts from a reset anyway)
    return layer


def _ours_no_finals_recompute() -> nn.Module:
    layer = _ours_no_finals()
    layer.recompute = True
    return layer


def _ours_no_finals_replay() -> nn.Module:
    layer = _ours_no_finals()
    layer.save_h = False  # backward replays h from x (a fused BatchNorm's float32 does so anyway)
    return layer


def _ours_fused(model: nn.Module) -> nn.Module:
    from autocuda.nn import fuse_batchnorm

    # Block.forward passes bn's output, reshaped to [T, B, ...], straight to neuron: a declared pair
    return fuse_batchnorm(model, pairs=[("bn", "neuron")])


NEURONS: dict[str, Callable[[], nn.Module]] = {
    "ours": _ours, "ours-compiled": _ours, "ours-compiled-ro": _ours, "ours-fused": _ours,
    "ours-fused-compiled": _ours, "ours-fused-compiled-ro": _ours, "ours-rc-compiled-ro": _ours_recompute,
    "ours-fused-rc": _ours_recompute, "ours-nf": _ours_no_finals, "ours-nf-compiled": _ours_no_finals,
    "ours-nf-compiled-ro": _ours_no_finals, "ours-fused-nf": _ours_no_finals,
    "ours-fused-nf-compiled": _ours_no_finals, "ours-fused-nf-compiled-ro": _ours_no_finals,
    "ours-nf-rc-compiled-ro": _ours_no_finals_recompute, "ours-fused-nf-rc-compiled-ro": _ours_no_finals_recompute,
    "ours-fused-nf-rp-compiled-ro": _ours_no_finals_replay,
    "ours-fused-rc-compiled-ro": _ours_recompute, "loop": LoopLIF, "loop-compiled": LoopLIF,
    "loop-compiled-ro": LoopLIF,
    "sj": lambda: _sj()[0].LIFNode(tau=TAU, step_mode="m", surrogate_function=_sj()[1].Sigmoid(alpha=ALPHA)),
    "sj-flexsn": _sj_flexsn,
}


# torch.compile's mode by the system's suffix (none: eager)
MODES = {"-compiled": "default", "-compiled-ro": "reduce-overhead"}
CHANNELS_LAST = "-cl"  # a last suffix: the model and its input in torch.channels_last
# the default systems: the rows of docs/performance.md's network table (any other combination by name)
SYSTEMS = ("ours", "ours-cl", "ours-compiled", "ours-compiled-ro", "ours-compiled-ro-cl", "ours-rc-compiled-ro-cl",
           "ours-fused", "ours-fused-compiled-ro", "loop", "loop-compiled", "loop-compiled-ro", "loop-compiled-ro-cl",
           "sj", "sj-cl", "sj-flexsn")


def neuron_of(system: str) -> str:
    return system.removesuffix(CHANNELS_LAST)


def mode_of(system: str) -> str:
    return next((mode for suffix, mode in MODES.items() if neuron_of(system).endswith(suffix)), "eager")


def known(system: str) -> bool:
    return neuron_of(system) in NEURONS


def build(system: str, device: torch.device, wrap: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
    """The system's model on `device`; `wrap` (DistributedDataParallel, say) is applied before torch.compile, so a
    compiled system compiles the wrapped model."""
    model = SpikingVGG(NEURONS[neuron_of(system)]).to(device)
    if system.endswith(CHANNELS_LAST):
        model = model.to(memory_format=torch.channels_last)
    if system.startswith("ours-fused"):
        model = _ours_fused(model)
    if wrap is not None:
        model = wrap(model)
    mode = mode_of(system)
    if mode != "eager":
        # every row builds a new model: without a reset Dynamo counts them as recompiles of one forward, and past
        # its limit (8) runs the rest eagerly
        torch._dynamo.reset()
        model = torch.compile(model, mode=mode)  # type: ignore[assignment]
    return model


def measure(system: str, T: int, B: int, precision: str, steps: int, device: torch.device,
            warmup: int = WARMUP, wrap: Callable[[nn.Module], nn.Module] | None = None) -> dict:
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    model = build(system, device, wrap)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(T, B, 3, 32, 32, device=device)
    if system.endswith(CHANNELS_LAST):
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    target = torch.randint(0, 10, (B,), device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bfloat16"
                else contextlib.nullcontext())

    def step() -> None:
        if mode_of(system) == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        _reset(model)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    sync()
    timers: list[Callable[[], float]] = []
    t0 = time.perf_counter()
    for _ in range(steps):
        timers.append(_timed(step, cuda))
    sync()
    wall = (time.perf_counter() - t0) / steps * 1e3
    ms = [timer() for timer in timers]
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20 if cuda else float("nan")
    deciles = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
    return {"step_ms": statistics.median(ms), "step_ms_p10": deciles[0], "step_ms_p90": deciles[-1],
            "wall_ms_per_step": wall, "first_step_s": first, "peak_mib": peak}


def measure_all(systems: list[str], shapes: list[tuple[int, int]], precisions: list[str], steps: int,
                device: torch.device, progress: Callable[[dict], None] = lambda row: None,
                warmup: int = WARMUP) -> list[dict]:
    """One row per (T, B), precision and system; a system whose library is missing is a row saying so."""
    rows = []
    for T, B in shapes:
        for precision in precisions:
            for system in systems:
                row: dict = {"system": system, "mode": mode_of(system), "T": T, "B": B, "precision": precision}
                try:
                    row.update(measure(system, T, B, precision, steps, device, warmup))
                except (ImportError, AttributeError) as error:
                    row["skipped"] = f"{type(error).__name__}: {error}"
                except Exception as error:  # a compiler's failure on one row: the others still run
                    row["skipped"] = f"failed, {type(error).__name__}: {str(error)[-300:]}"
                rows.append(row)
                progress(row)
    return rows


def _timed(step: Callable[[], None], cuda: bool) -> Callable[[], float]:
    """Run `step`; return a function giving its time in ms (CUDA events are read after the final sync)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        return lambda: start.elapsed_time(end)
    t = time.perf_counter()
    step()
    elapsed = (time.perf_counter() - t) * 1e3
    return lambda: elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for network.json and network.txt")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma list of {', '.join(NEURONS)}, each also with the suffix {CHANNELS_LAST}")
    parser.add_argument("--shapes", default="4x64,16x32", help="comma list of TxB (default 4x64,16x32)")
    parser.add_argument("--precisions", default="float32,bfloat16", help="float32 and/or bfloat16 (AMP autocast)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row (default 20)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test)")
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if not known(s)]
    if unknown:
        parser.error(f"--systems: unknown {unknown[0]!r} (known: {', '.join(NEURONS)}, each also with "
                     f"{CHANNELS_LAST})")
    device = torch.device(args.device)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    done: list[dict] = []

    def save(row: dict) -> None:  # after every row: a run cut short keeps what it measured
        print(json.dumps(row), flush=True)
        done.append(row)
        (args.out / "network.json").write_text(json.dumps({"device": _device_name(device), "rows": done}, indent=1))
    rows = measure_all(systems, shapes, args.precisions.split(","), args.steps, device, save)
    table = format_table(rows)
    (args.out / "network.txt").write_text(table)
    print(table)
    return 0


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# A table column: its title, its width and alignment (a format spec: ">9"), and how a row's value is spelled there
Column = tuple[str, str, Callable[[dict], str]]
HEAD: list[Column] = [("T", ">3", lambda r: r["T"]), ("B", ">4", lambda r: r["B"]),
                      ("precision", "<9", lambda r: r["precision"]), ("system", "<25", lambda r: r["system"]),
                      ("mode", "<15", lambda r: r.get("mode", ""))]


def columns_table(rows: list[dict], head: list[Column], measures: list[Column]) -> str:
    """One line a row: the `head` columns, then the `measures`, or for a row that was skipped, why."""
    lines = [" ".join(f"{title:{width}}" for title, width, _ in head + measures)]
    for r in rows:
        text = " ".join(f"{value(r):{width}}" for _, width, value in head)
        if "skipped" in r:
            lines.append(f"{text} skipped: {r['skipped'][:80]}")
        else:
            lines.append(f"{text} " + " ".join(f"{value(r):{width}}" for _, width, value in measures))
    return "\n".join(lines) + "\n"


def format_table(rows: list[dict]) -> str:
    return columns_table(rows, HEAD, [("step ms", ">9", lambda r: f"{r['step_ms']:.2f}"),
                                      ("wall ms", ">9", lambda r: f"{r['wall_ms_per_step']:.2f}"),
                                      ("first s", ">8", lambda r: f"{r['first_step_s']:.1f}"),
                                      ("peak MiB", ">9", lambda r: f"{r['peak_mib']:.0f}")])


if __name__ == "__main__":
    raise SystemExit(main())
