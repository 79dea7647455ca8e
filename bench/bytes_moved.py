"""Bytes moved per neuron-step by a BatchNorm + LIF block, unfused (torch's BatchNorm, then our neuron) and fused
(`BatchNormNeuron`: the normalisation inside the neuron's kernels, its parameters one per channel).

The neuron kernels' traffic is counted from their generated parameter lists: a `*_seq` pointer moves T*N elements,
a `*_checkpoints` one N per K steps written (K = min(8, T), as the launch picks) and read for the segments after
the first, another pointer N (per neuron) or C (per
channel: left out, C against T*N), read if const, else written. The fused kernels are those of float32 input,
which save no h (backward replays it from x). The
torch passes around them are counted as the docs describe them (docs/batchnorm.md): BatchNorm's statistics read
x once; its normalising pass reads x and writes y; its backward reads the gradient of y and x twice (a reduction,
then the elementwise pass) and writes the gradient of x; the fused block's backward is two passes of the neuron's
kernels (`nn.batchnorm_passes`), the second adding the statistics' term to the gradient it writes, eager and
compiled alike.

    python -m bench.bytes_moved [--steps 4,16] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autocuda.codegen.broadcast import CORRECTION_KEYS
from autocuda.codegen.kernels import neuron_kernel
from autocuda.spec.load import load_spec
from autocuda.spec.transform import INPUT_SCALE, INPUT_SHIFT, with_input_affine

# the options of a training call of a reset layer: initial states are numbers, no gradient of the final states
FORWARD = {"given_inits": False, "save_for_backward": True}
INFERENCE = {"given_inits": False, "save_for_backward": False}
BACKWARD = {"given_inits": False, "grad_finals": False}
# torch passes, in elements per neuron-step: (reads, writes)
BN_STATISTICS, BN_NORMALISE, BN_BACKWARD = (1, 0), (1, 1), (4, 1)


def kernel_elements(kernel, steps: int) -> tuple[float, float]:
    """(read, written) elements per neuron-step of a neuron kernel, from its pointer parameters."""
    read = written = 0.0
    for name, param in kernel.cparams.items():
        if not param.pointer or name in (f"grad_{INPUT_SCALE}", f"grad_{INPUT_SHIFT}", INPUT_SCALE, INPUT_SHIFT,
                                          *CORRECTION_KEYS):
            continue  # one per channel
        if name.endswith("_checkpoints"):  # forward writes a row every K steps; backward reads those before T - 1
            rows = (steps - 1 if param.const else steps) // kernel.checkpoint_steps
            share = rows / steps
        else:
            share = 1.0 if name.endswith("_seq") else 1.0 / steps
        if param.const:
            read += share
        else:
            written += share
    return read, written


def count(steps: int) -> list[dict]:
    lif = load_spec("lif")
    fused = with_input_affine(lif)
    channel = {"tensors": [INPUT_SCALE, INPUT_SHIFT], "per_channel": [INPUT_SCALE, INPUT_SHIFT]}

    def neuron(kind: str, options: dict, is_fused: bool) -> tuple[float, float]:
        spec, extra = (fused, {**channel, "replay_charge": True, "replay": min(8, steps)}) if is_fused else (lif, {})
        return kernel_elements(neuron_kernel(spec, kind, "float32", **options, **extra), steps)

    def total(*passes: tuple[float, float]) -> float:
        return sum(r + w for r, w in passes)

    # backward: the neuron's BPTT twice (the per-channel sums, then the input's gradient with the statistics' term)
    two_passes = (neuron("bptt", {**BACKWARD, "gradients": "sums"}, True),
                  neuron("bptt", {**BACKWARD, "gradients": "corrected"}, True))
    rows = []
    for phase, unfused, fused_passes in (
            ("eval", (BN_NORMALISE, neuron("fptt", INFERENCE, False)), (neuron("fptt", INFERENCE, True),)),
            ("training forward", (BN_STATISTICS, BN_NORMALISE, neuron("fptt", FORWARD, False)),
             (BN_STATISTICS, neuron("fptt", FORWARD, True))),
            ("backward, compiled", (neuron("bptt", BACKWARD, False), BN_BACKWARD), two_passes),
            ("backward, eager", (neuron("bptt", BACKWARD, False), BN_BACKWARD), two_passes)):
        rows.append({"T": steps, "phase": phase, "unfused": total(*unfused), "fused": total(*fused_passes)})
    for mode in ("compiled", "eager"):
        parts = [r for r in rows if r["phase"] in ("training forward", f"backward, {mode}")]
        rows.append({"T": steps, "phase": f"training step, {mode}", "unfused": sum(r["unfused"] for r in parts),
                     "fused": sum(r["fused"] for r in parts)})
    for row in rows:
        row["share"] = row["fused"] / row["unfused"]
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["elements per neuron-step (x 4 bytes in float32, x 2 in bfloat16; per-channel vectors left out)",
             f"{'T':>3} {'phase':<24} {'unfused':>8} {'fused':>8} {'share':>6}"]
    lines += [f"{r['T']:>3} {r['phase']:<24} {r['unfused']:>8.2f} {r['fused']:>8.2f} {r['share']:>6.1%}"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="4,16", help="comma list of T (default 4,16)")
    parser.add_argument("--out", type=Path, help="folder for bytes_moved.json and bytes_moved.txt")
    args = parser.parse_args(argv)
    rows = [row for steps in args.steps.split(",") for row in count(int(steps))]
    table = format_table(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bytes_moved.json").write_text(json.dumps(rows, indent=1))
        (args.out / "bytes_moved.txt").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
