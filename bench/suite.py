"""The benchmark suite: autocuda's kernels against SpikingJelly 2.0, an eager PyTorch loop and `torch.compile` of
that loop, on one device.

One run measures the copy bandwidth (the memory floor of every workload: bytes / bandwidth with 2 element accesses
per neuron-step in inference and 6 in training), then the parts asked for: speed, memory, host overhead, first
use (`measure`). It prints the report and writes results.json, table.txt and plot.png (`report`) under
bench/results/<date>-<gpu>/. Run it from the repository's root as `python -m bench`; `--device cpu --quick`
exercises the logic on a CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .measure import (
    ACCESSES,
    GRAD_COSINE,
    SPIKE_AGREEMENT,
    STATE_AGREEMENT,
    STATE_TOL,
    TIMED_FINAL_STATES,
    Clock,
    Config,
    Runner,
    environment,
)
from .report import write_outputs
from .systems import SpikingJelly
from .workloads import (
    ALIASES,
    CORE,
    DTYPES,
    GROUPS,
    MODES,
    WORKLOADS,
    ZOO,
    Workload,
    dtype_name,
    is_spec_file,
    spec_workload,
    workload,
)

RESULTS = Path(__file__).resolve().parent / "results"  # where a run's folder goes unless --out names one
FULL_SHAPES = ((8, 8 << 20), (64, 1 << 20), (256, 64 << 10), (1024, 16 << 10), (4, 4096))  # (T, N)
QUICK_SHAPES = {"cuda": ((8, 1 << 20), (64, 64 << 10), (4, 4096)), "cpu": ((4, 64), (16, 32))}
PARTS = ("speed", "memory", "host", "first-use", "network", "sj-classes")
# Parts run when --parts is not given; `network` (whole-model training steps, bench/network.py, minutes of
# torch.compile) and `sj-classes` (SpikingJelly 2.0's newer classes against ours, bench/sj_classes.py: 20 classes
# in each dtype, each class's kernels compiled on first use) only when asked for
DEFAULT_PARTS = ("speed", "memory", "host", "first-use")
NETWORK_SHAPES = ((4, 64), (16, 32))  # (T, batch) of the network part
# (T, N) of the sj-classes part: issue 46's target shape; --quick and the CPU (the logic only) smaller
SJ_CLASSES_SHAPES = {"cuda": (8, 8 << 20), "quick": (8, 1 << 20), "cpu": (8, 1024)}


def _shape(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)([KM]?)", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected TxN, e.g. 8x8M, 64x1M, 4x4096")
    unit = {"": 1, "K": 1 << 10, "M": 1 << 20}[match[3].upper()]
    return int(match[1]), int(match[2]) * unit



def _shape_text(shape: tuple[int, int]) -> str:
    """(T, N) as --shapes spells it: 8x8M, 64x64K, 4x4096."""
    steps, neurons = shape
    for unit, shift, least in (("M", 20, 1), ("K", 10, 16)):
        if neurons % (1 << shift) == 0 and neurons >> shift >= least:
            return f"{steps}x{neurons >> shift}{unit}"
    return f"{steps}x{neurons}"


def _shape_list(shapes: Sequence[tuple[int, int]]) -> str:
    return ",".join(map(_shape_text, shapes))


def _choices(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def _workloads(text: str) -> list[str]:
    """Workload names, aliases, groups (core, zoo, all) and spec files, in the order given, each once. A spec
    file is loaded here, so that a missing file or a bad spec is a usage error naming it."""
    names: list[str] = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        names += GROUPS.get(name, [ALIASES.get(name, name)])
    unknown = [n for n in names if n not in WORKLOADS and not is_spec_file(n)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(unknown)} (known: {', '.join(WORKLOADS)}; "
                                         f"groups: {', '.join(GROUPS)}; or a spec file: my_neuron.toml)")
    for name in filter(is_spec_file, names):
        try:
            spec_workload(name)
        except (OSError, ValueError) as error:  # a missing file; SpecError is a ValueError
            raise argparse.ArgumentTypeError(f"spec file {name!r}: {error}") from None
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (`python -m bench --help` lists them)."""
    parser.add_argument("--quick", action="store_true", help="few shapes and repetitions, no torch.compile (a smoke "
                        "test; with --device cpu: tiny shapes)")
    parser.add_argument("--workloads", type=_workloads, default=list(CORE),
                        help=f"comma-separated workloads or groups of them: core (the default: {', '.join(CORE)}), "
                             f"zoo (the model zoo: {', '.join(ZOO)}), all (both); e.g. core,alif or lif,qif "
                             f"(aliases: {', '.join(f'{k} = {v}' for k, v in ALIASES.items())}); or your own "
                             f"spec files, e.g. my_neuron.toml or lif,my_neuron.toml (timed against an eager "
                             f"loop of its reference and torch.compile of that loop)")
    parser.add_argument("--dtypes", type=lambda s: _choices(s, list(DTYPES), "dtype"), default=list(DTYPES),
                        help="comma-separated, of float32,float16,bfloat16 (default all)")
    parser.add_argument("--shapes", type=lambda s: [_shape(p) for p in s.split(",")], default=None,
                        help=f"comma-separated TxN, e.g. 8x8M,64x1M (default: {_shape_list(FULL_SHAPES)}; with --quick "
                             f"{_shape_list(QUICK_SHAPES['cuda'])}, on a CPU {_shape_list(QUICK_SHAPES['cpu'])})")
    parser.add_argument("--parts", type=lambda s: _choices(s, PARTS, "part"), default=list(DEFAULT_PARTS),
                        help=f"comma-separated, of {','.join(PARTS)} (default {','.join(DEFAULT_PARTS)}; network: "
                             f"a spiking VGG's training step per system, T x batch "
                             f"{', '.join(f'{t}x{b}' for t, b in NETWORK_SHAPES)}, float32 and AMP bfloat16; "
                             f"sj-classes: SpikingJelly 2.0's newer classes against ours, a training step each at "
                             f"{_shape_text(SJ_CLASSES_SHAPES['cuda'])} in the run's dtypes)")
    parser.add_argument("--modes", type=lambda s: tuple(_choices(s, MODES, "mode")), default=MODES,
                        help="comma-separated, of inference,training (default both)")
    parser.add_argument("--no-peers", action="store_true", help="ours only: no SpikingJelly, eager or compile times")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (to test the logic)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default bench/results/<date>-<gpu>)")
    parser.add_argument("--compile-budget", type=float, default=120.0, metavar="S",
                        help="seconds of torch.compile time, after which compile is skipped (default 120)")
    parser.add_argument("--compile-max-t", type=int, default=64, metavar="T",
                        help="largest T whose unrolled loop is compiled; longer loops compile the step alone, "
                             "called by a Python loop over T (default 64)")
    parser.add_argument("--eager-max-call", type=float, default=2.0, metavar="S",
                        help="skip timing the eager loop where one call takes longer (default 2 s)")
    parser.add_argument("--first-use-spec", default="lif", help="spec of the first-use benchmark (default lif)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue a run cut short (same options and --out): "
                        "keep the speed rows in its progress.jsonl, measure the rest and the other parts")
    parser.add_argument("--plot", type=Path, default=None, metavar="RESULTS_JSON",
                        help="only redraw plot.png (and table.txt) from an earlier results.json")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def config(args: argparse.Namespace, results_root: Path) -> Config:
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: run on a GPU, or pass --device cpu to test the benchmark's logic")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # kernels launch on the current device's current stream
    shapes = args.shapes or list(QUICK_SHAPES.get(device.type, QUICK_SHAPES["cuda"]) if args.quick else FULL_SHAPES)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or results_root / f"{datetime.date.today().isoformat()}-{_slug(gpu)}{'-quick' if args.quick else ''}"
    return Config(device, [workload(k) for k in args.workloads], [DTYPES[d] for d in args.dtypes], shapes,
                  args.parts, args.quick, not args.no_peers, out, args.compile_budget, args.compile_max_t,
                  args.eager_max_call, args.first_use_spec, args.seed, getattr(args, "resume", False),
                  getattr(args, "modes", MODES))


def run(args: argparse.Namespace, results_root: Path = RESULTS) -> int:
    """Run the parts asked for; print the report; write results.json, table.txt and plot.png."""
    if args.plot is not None:
        return write_outputs(json.loads(args.plot.read_text()), args.plot.parent)
    cfg = config(args, results_root)
    torch.manual_seed(cfg.seed)
    runner = Runner(cfg)
    peer = runner.sj.version or runner.sj.missing
    runner.log(f"copy bandwidth {runner.bandwidth / 1e9:.0f} GB/s; SpikingJelly: {peer}")
    results: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:],
        "environment": environment(cfg.device, runner.sj), "copy_bandwidth_GBps": runner.bandwidth / 1e9,
        "method": _method(cfg, runner.clock),
        "workloads": {w.key: _describe(w, runner.sj, cfg.device) for w in cfg.workloads},
    }
    if "speed" in cfg.parts:
        results["speed"] = [dataclasses.asdict(r) | r.derived() for r in runner.speed()]
        results["compile_seconds_spent"] = runner.compile_spent
    for part, method in (("memory", runner.memory), ("host", runner.host), ("first-use", runner.first_use)):
        if part in cfg.parts:
            results[part.replace("-", "_")] = method()
    if "network" in cfg.parts:
        results["network"] = _network(cfg, runner)
    if "sj-classes" in cfg.parts:
        results["sj_classes"] = _sj_classes(cfg, runner)
    results["elapsed_s"] = time.perf_counter() - runner.started
    return write_outputs(results, cfg.out)


def _network(cfg: Config, runner: Runner) -> list[dict[str, Any]]:
    """bench/network.py's rows: every system (peers only with peers on), float32 and AMP bfloat16."""
    from . import network

    systems = [s for s in network.SYSTEMS if cfg.peers or s.startswith("ours")]
    precisions = ["float32", "bfloat16"] if cfg.device.type == "cuda" else ["float32"]
    shapes = list(NETWORK_SHAPES) if cfg.device.type == "cuda" else [(2, 2)]
    return network.measure_all(systems, shapes, precisions, 3 if cfg.quick else 20, cfg.device,
                               lambda row: runner.log(f"network {row}"))


def _sj_classes(cfg: Config, runner: Runner) -> list[dict[str, Any]]:
    """bench/sj_classes.py's rows: every class in the run's dtypes at SJ_CLASSES_SHAPES (SpikingJelly's columns
    empty with --no-peers)."""
    from . import sj_classes

    cpu = cfg.device.type == "cpu"
    steps, neurons = SJ_CLASSES_SHAPES["cpu" if cpu else "quick" if cfg.quick else "cuda"]
    reps = 1 if cpu else 3 if cfg.quick else 20
    return sj_classes.run(steps, neurons, reps, str(cfg.device), [dtype_name(d) for d in cfg.dtypes],
                          peers=cfg.peers, progress=lambda row: runner.record("sj-classes", row))


def _method(cfg: Config, clock: Clock) -> dict[str, Any]:
    tolerances = {dtype_name(k): v for k, v in STATE_TOL.items()}
    return {
        "timing": ("CUDA events, median after warm-up, L2 flushed (256 MiB written) before each repetition"
                   if clock.cuda else "wall time, median after warm-up"),
        "training": "forward + autograd.grad(spike_seq, [x, learnable params], g) with g ~ randn: the gradients "
                    "of (spike_seq * g).sum()",
        "eager": "a Python loop over T of a torch step with SigmoidSpike: hand-written per model (core), the "
                 "spec through autocuda.runtime.reference.step (zoo: SpecStep); torch.compile compiles the same "
                 "loop (up to "
                 f"T = {cfg.compile_max_t}; longer loops: the step alone, called by the Python loop)",
        "timed_outputs": "spike_seq and the final states" if TIMED_FINAL_STATES else
                         "spike_seq alone (ours and torch.compile write no final state; SpikingJelly returns its "
                         "own); our final states are checked by a call that returns them",
        "floor_accesses_per_neuron_step": ACCESSES, "quick": cfg.quick, "seed": cfg.seed,
        "checks": f"against the eager loop in float32 on the same inputs: spikes >= {SPIKE_AGREEMENT:.1%} equal, "
                  f"final states >= {STATE_AGREEMENT:.1%} close (rtol = atol = {tolerances}) or FAIL; grad_x "
                  f"cosine >= {GRAD_COSINE} or warn",
    }


def _describe(w: Workload, sj: SpikingJelly, device: torch.device) -> dict[str, Any]:
    return {"label": w.label, "params": dict(w.params), "tensors": dict(w.tensors), "initial": list(w.initial),
            "input_scale_shift": list(w.input), "eager_step": getattr(w.step, "__name__", repr(w.step)),
            "no_compile": w.no_compile, "sj_function": w.sj, "sj_keywords": dict(w.sj_names),
            "sj_implementation": sj.implementation(w, device) if w.sj and sj.functional is not None else None}


def main(argv: Sequence[str] | None = None, results_root: Path = RESULTS, prog: str = "python -m bench") -> int:
    """Parse the options and run; the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv), results_root)
