"""Data-parallel training of bench.network's spiking VGG: DistributedDataParallel over 1 to N GPUs of one host
(NCCL), eager and under torch.compile, per system; samples per second and weak-scaling efficiency.

    python -m bench.ddp --out DIR [--gpus 1,2,4] [--systems ours,ours-compiled,loop-compiled,sj]
        [--shape 4x64] [--precision float32] [--steps 20] [--ddp-optimizer ddp_optimizer]
        [--bucket-view] [--no-sync-buffers]

Each GPU count is one `torch.distributed.run --standalone --nproc_per_node=N -m bench.ddp --worker` run that
measures every system in turn (`bench.network.measure` with the model wrapped in DDP before torch.compile, as
torch recommends). Weak scaling: each process trains on B samples per step (the global batch is N x B). A step's
time is the slowest process's median step (CUDA events); samples/s = N x B / step; the efficiency at N GPUs is
samples/s at N over N times samples/s at 1 GPU, of the same system. `--ddp-optimizer` sets Dynamo's
`optimize_ddp` (how a compiled DDP model is split at DDP's gradient buckets; `no_optimization`: one graph, the
gradients reduced after the whole backward). Rows go to ddp.json as each GPU count finishes; ddp.txt holds the
table. `--device cpu` runs the logic on CPU processes over gloo (the times mean nothing).
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import network

SYSTEMS = ("ours", "ours-compiled", "loop", "loop-compiled", "sj")
DDP_OPTIMIZERS = ("ddp_optimizer", "no_optimization")


def run_systems(systems: list[str], T: int, B: int, precision: str, steps: int, device: torch.device,
                warmup: int = network.WARMUP, bucket_view: bool = False, sync_buffers: bool = True
                ) -> list[dict]:
    """In a process of an initialised process group: each system's DDP training step measured on every process,
    one row per system with the slowest process's step time and peak memory (the same rows on every process).
    `bucket_view`: DDP's gradient_as_bucket_view; `sync_buffers`: whether each forward broadcasts the buffers
    (BatchNorm's running statistics) from the first process (`buffer_option`)."""
    from torch.nn.parallel import DistributedDataParallel

    world = dist.get_world_size()
    ids = [device.index] if device.type == "cuda" else None

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=bucket_view,
                                       **buffer_option(sync_buffers))

    rows = []
    for system in systems:
        row: dict = {"system": system, "mode": network.mode_of(system), "gpus": world, "T": T, "B": B,
                     "precision": precision, "gradient_as_bucket_view": bucket_view, "sync_buffers": sync_buffers}
        try:
            own = network.measure(system, T, B, precision, steps, device, warmup, wrap=wrap)
            own["graphs"], own["graph_breaks"] = _dynamo_counts()
        except Exception as error:  # noqa: BLE001 - a failing row is reported; the others still run
            own = {"skipped": f"{type(error).__name__}: {str(error)[-300:]}"}
        every: list = [None] * world
        dist.all_gather_object(every, own)
        row.update(_slowest(every))
        if "step_ms" in row:
            row["samples_per_s"] = world * B / row["step_ms"] * 1e3
        rows.append(row)
    return rows


def buffer_option(sync: bool) -> dict[str, Any]:
    """DDP's option that syncs the buffers at each forward: forward_sync_buffers from torch 2.13 on (which deprecates
    broadcast_buffers; off, the buffers are still synced once, when DDP is built), else broadcast_buffers (off: never
    synced; a model built from one seed starts with equal buffers anyway)."""
    from torch.nn.parallel import distributed

    names = inspect.signature(distributed.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers": sync}


def _dynamo_counts() -> tuple[int, int]:
    """Graphs Dynamo compiled and graph breaks it took since the last `torch._dynamo.reset()`."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def _slowest(rows: list[dict]) -> dict:
    """One process's row of measures: the slowest step, the most memory; skipped where any process skipped."""
    skipped = [r["skipped"] for r in rows if "skipped" in r]
    if skipped:
        return {"skipped": skipped[0]}
    slowest = max(rows, key=lambda r: r["step_ms"])
    return {**slowest, "peak_mib": max(r["peak_mib"] for r in rows),
            "first_step_s": max(r["first_step_s"] for r in rows)}


def with_efficiency(rows: list[dict]) -> list[dict]:
    """The rows with each measured row's weak-scaling efficiency against the same system's row at 1 GPU."""
    single = {(r["system"], r["T"], r["B"], r["precision"]): r["samples_per_s"] for r in rows
              if r["gpus"] == 1 and "samples_per_s" in r}
    out = []
    for r in rows:
        base = single.get((r["system"], r["T"], r["B"], r["precision"]))
        if "samples_per_s" in r and base:
            r = {**r, "efficiency": r["samples_per_s"] / (r["gpus"] * base)}
        out.append(r)
    return out


def format_table(rows: list[dict]) -> str:
    head = [("gpus", ">4", lambda r: r["gpus"]), *network.HEAD]
    return network.columns_table(rows, head, [
        ("step ms", ">8", lambda r: f"{r['step_ms']:.2f}"),
        ("p10-p90 ms", ">11", lambda r: f"{r['step_ms_p10']:.2f}-{r['step_ms_p90']:.2f}" if "step_ms_p10" in r else ""),
        ("wall ms", ">8", lambda r: f"{r['wall_ms_per_step']:.2f}" if "wall_ms_per_step" in r else ""),
        ("samples/s", ">10", lambda r: f"{r['samples_per_s']:.0f}"),
        ("eff.", ">6", lambda r: f"{r['efficiency']:.1%}" if "efficiency" in r else ""),
        ("graphs", ">6", lambda r: r["graphs"]), ("breaks", ">6", lambda r: r["graph_breaks"]),
        ("first s", ">8", lambda r: f"{r['first_step_s']:.1f}"), ("peak MiB", ">9", lambda r: f"{r['peak_mib']:.0f}")])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for ddp.json and ddp.txt")
    parser.add_argument("--gpus", default="1,2", help="comma list of process counts (default 1,2)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of bench.network's systems")
    parser.add_argument("--shape", default="4x64", help="T x B per process (default 4x64)")
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row (default 20)")
    parser.add_argument("--ddp-optimizer", default="ddp_optimizer", choices=DDP_OPTIMIZERS,
                        help="torch._dynamo.config.optimize_ddp for the compiled systems")
    parser.add_argument("--bucket-view", action="store_true",
                        help="DDP's gradient_as_bucket_view=True (gradients are views of the reduction buckets)")
    parser.add_argument("--no-sync-buffers", action="store_true",
                        help="the buffers (BatchNorm's running statistics) synced once, not at each forward "
                             "(DDP's forward_sync_buffers=False; broadcast_buffers=False before torch 2.13)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a process of one run: its rows' file
    return parser


def _worker(args: argparse.Namespace) -> int:
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = args.ddp_optimizer
    T, B = (int(v) for v in args.shape.split("x"))
    rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    try:
        rows = run_systems(args.systems.split(","), T, B, args.precision, args.steps, device,
                           bucket_view=args.bucket_view, sync_buffers=not args.no_sync_buffers)
        for row in rows:
            row["ddp_optimizer"] = args.ddp_optimizer
        if dist.get_rank() == 0:
            args.worker.write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()
    return 0


def _skipped(args: argparse.Namespace, count: int, why: str) -> list[dict]:
    """A row for each system of a GPU count not measured, saying why."""
    T, B = (int(v) for v in args.shape.split("x"))
    return [{"system": s, "mode": network.mode_of(s), "gpus": count, "T": T, "B": B, "precision": args.precision,
             "skipped": why} for s in args.systems.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(args)
    unknown = [s for s in args.systems.split(",") if not network.known(s)]
    if unknown:
        parser.error(f"--systems: unknown {unknown[0]!r} (bench.network's systems: {', '.join(network.NEURONS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    available = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count() or 1
    rows: list[dict] = []
    for count in (int(n) for n in args.gpus.split(",")):
        if count > available:
            rows += _skipped(args, count, f"{count} processes, {available} devices here")
            continue
        part = args.out / f"ddp-{count}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}",
                   "-m", "bench.ddp", *(argv if argv is not None else sys.argv[1:]), "--worker", str(part)]
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                                    os.environ.get("PYTHONPATH")]))}
        finished = subprocess.run(command, env=environment)
        if finished.returncode or not part.is_file():
            rows += _skipped(args, count, f"the run exited with {finished.returncode}")
        else:
            rows += json.loads(part.read_text())
        rows = with_efficiency(rows)
        (args.out / "ddp.json").write_text(json.dumps({"device": network._device_name(torch.device(args.device)),
                                                       "rows": rows}, indent=1))
    table = format_table(rows)
    (args.out / "ddp.txt").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
