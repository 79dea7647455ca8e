"""Our FlexSN against SpikingJelly 2.0's FlexSN, the same core function object given to both, in one run.

The cores are the zoo's ALIF, SFA-LIF and CUBA-LIF written as FlexSN steps (`bench/workloads.py`), their spike
SpikingJelly's `surrogate.sigmoid.apply(z, 4)`. Per (model, dtype, T, N), in training (forward + backward of
(spike_seq * g).sum(), as the suite times it: `Clock`, L2 flushed, median):

- `ours-flexsn`: `autocuda.nn.FlexSN(core, num_states)` (the traced spec's kernels);
- `sj-flexsn`: SpikingJelly's `FlexSN(core, num_states)` (Triton, autotuned on its first calls);
- `ours-spec`: the shipped spec through `autocuda.functional.multi_step` (the same model written in TOML);

the first call of each (compile included; ours also traces and derives on its first shape of a model), the
spike agreement and gradient cosine of ours against SpikingJelly's, and the bytes per neuron-step held from
forward to backward. Rows run in priority order (the models in the order given, each float32 then bfloat16)
and stop starting once --budget seconds are spent; each row is appended to progress.jsonl as it ends.

    python -m bench.flexsn_peer --out DIR [--models alif,sfa_lif,cuba_lif] [--dtypes float32,bfloat16]
        [--shapes 8x8M,64x1M,1024x16K] [--budget 200] [--systems ours-flexsn,sj-flexsn,ours-spec] [--first-only]

SpikingJelly's first call compiles its kernels for each (T, N, dtype) and takes minutes at long T. `--first-only`
runs only first calls, so several processes can fill Triton's disk cache in parallel before one timing run.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .measure import Clock, _memory_of
from .suite import _shape
from .systems import ours
from .workloads import ALPHA, DTYPES, WORKLOADS, Case, Forward, call, dtype_name

SYSTEMS = ("ours-flexsn", "sj-flexsn", "ours-spec")
TARGETS = {(8, 8 << 20): 3.0, (64, 1 << 20): 3.0, (1024, 16 << 10): 5.0}  # issue 26: training, x FlexSN


def layer_forward(layer: torch.nn.Module, case: Case) -> Forward:
    def run() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        layer.reset()
        spikes = layer(case.x)
        return spikes, tuple(layer.states)
    return run


def systems(case: Case) -> dict[str, Forward]:
    """Each system's forward on `case`, the FlexSN layers built around one core object."""
    from autocuda.nn import FlexSN

    w = case.workload
    sigmoid = importlib.import_module("spikingjelly.activation_based.surrogate").sigmoid
    sj_flexsn = importlib.import_module("spikingjelly.activation_based.neuron.flexsn").FlexSN
    core = w.flexsn(w.params, lambda z: sigmoid.apply(z, ALPHA))
    states = len(w.initial)
    return {"ours-flexsn": layer_forward(FlexSN(core, states), case),
            "sj-flexsn": layer_forward(sj_flexsn(core, states), case),
            "ours-spec": ours(case)}


def row(case: Case, clock: Clock, chosen: tuple[str, ...] = SYSTEMS, first_only: bool = False) -> dict[str, Any]:
    w, (steps, neurons) = case.workload, case.x.shape
    result: dict[str, Any] = {"model": w.label, "dtype": dtype_name(case.dtype), "T": steps, "N": neurons}
    made = {name: forward for name, forward in systems(case).items() if name in chosen}
    outputs = {}
    for name, forward in made.items():
        step = call(case, forward)
        try:
            result[f"{name}_first_call_s"] = clock.first(step)
            if first_only:
                continue
            result[f"{name}_ms"] = clock.median(step)
            if case.x.is_cuda:
                result[f"{name}_saved_B"] = _memory_of(case, forward)["saved_bytes_per_step"]
            spikes, _ = forward()
            grad = torch.autograd.grad(spikes, [case.x], case.g)[0]
            outputs[name] = (spikes.detach().float(), grad.float())
        except Exception as error:  # noqa: BLE001 - reported in the row
            result[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    if "ours-flexsn" in outputs and "sj-flexsn" in outputs:
        (s1, g1), (s2, g2) = outputs["ours-flexsn"], outputs["sj-flexsn"]
        result["spike_agreement"] = (s1 == s2).float().mean().item()
        result["grad_cosine"] = torch.nn.functional.cosine_similarity(g1.flatten(), g2.flatten(), dim=0).item()
    if result.get("ours-flexsn_ms") and result.get("sj-flexsn_ms"):
        result["speedup"] = result["sj-flexsn_ms"] / result["ours-flexsn_ms"]
        result["target"] = TARGETS.get((steps, neurons))
    return result


def table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "dtype", "T", "N", "ours-flexsn ms", "sj-flexsn ms", "ours-spec ms", "x FlexSN", "target",
            "saved B ours / SJ", "first call s ours / SJ", "spikes equal", "grad cos"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def f(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['T']} | {r['N']} | {r['skipped']} |")
            continue
        errors = "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
        cells = [r["model"], r["dtype"], str(r["T"]), str(r["N"]), f(r.get("ours-flexsn_ms"), ".3f"),
                 f(r.get("sj-flexsn_ms"), ".3f"), f(r.get("ours-spec_ms"), ".3f"), f(r.get("speedup"), ".2f"),
                 f(r.get("target"), ".0f"),
                 f"{f(r.get('ours-flexsn_saved_B'), '.1f')} / {f(r.get('sj-flexsn_saved_B'), '.1f')}",
                 f"{f(r.get('ours-flexsn_first_call_s'), '.2f')} / {f(r.get('sj-flexsn_first_call_s'), '.1f')}",
                 f(r.get("spike_agreement"), ".5f"), f(r.get("grad_cosine"), ".5f")]
        lines.append("| " + " | ".join(cells) + " |" + (f" {errors}" if errors else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="alif,sfa_lif,cuba_lif")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--shapes", default="8x8M,64x1M,1024x16K")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds after which no new row starts")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    parser.add_argument("--first-only", action="store_true",
                        help="time only each system's first call (fills compiler caches, e.g. Triton's, for a "
                             "later timing run)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cuda; cpu checks the logic only (tiny --shapes)")
    args = parser.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}")
    device = torch.device(args.device)
    clock = Clock(device, quick=False)
    shapes = [_shape(s) for s in args.shapes.split(",")]
    cases = [(WORKLOADS[m], DTYPES[d], shape) for m in args.models.split(",") for d in args.dtypes.split(",")
             for shape in shapes]
    args.out.mkdir(parents=True, exist_ok=True)
    progress = args.out / "progress.jsonl"
    start, rows = time.perf_counter(), []
    for w, dtype, (steps, neurons) in cases:
        if time.perf_counter() - start > args.budget:
            rows.append({"model": w.label, "dtype": dtype_name(dtype), "T": steps, "N": neurons,
                         "skipped": f"not run: the {args.budget:g} s budget was spent"})
            continue
        torch.manual_seed(0)
        case = Case.draw(w, dtype, steps, neurons, device).mode(True)
        rows.append(row(case, clock, tuple(args.systems.split(",")), args.first_only))
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with progress.open("a") as out:
            out.write(json.dumps(rows[-1]) + "\n")
        print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "rows": rows}
    (args.out / "flexsn_peer.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
