"""CPU time of deriving and rendering kernels, in a fresh process with an empty autocuda cache: where the symbolic
work of a cold process (a test worker's, a new neuron's first use) goes.

The child process loads every shipped spec and builds the source of each kernel variant that tests/test_golden.py
pins (every spec x dtype x kernel kind, under each reset with and without detach_reset; the kernels' options one
at a time; the layout models' layouts), through `autocuda.codegen.kernels.source`: parse, step system, derivation,
plans, printing, rendering. Nothing is compiled. It times each phase by wrapping the functions that do it, as CPU
time of the thread that runs them (the symbolic stages run in worker threads: `spec.budget`), each phase's own
time without the phases it calls:

    load       reading the TOML files into specs (`spec.load._load_file`)
    parse      the spec's expressions into sympy, [ode] discretised (`spec.model._parse_spec_expressions`)
    system     the step system: reset chosen, constants folded (`spec.system._step_system`)
    derive     the forward step and its adjoint (`spec.derive.derive`)
    plans      the kernel plans (`codegen.kernel_plans.forward_plan` / `backward_plan`), less what follows
    cse        common subexpressions (`codegen.builder.shared_subexpressions`)
    printing   sympy -> C text (`codegen.printer.CudaPrinter.__call__`)
    naming     the derivation's text that kernel names are digests of (`codegen.neuron_kernel._text`)
    describe   the comment lines heading a kernel (`codegen.neuron_kernel.describe`)
    render     the body from the plan and the template (`CKernel.full_codes`)
    other      the rest of the process's CPU time over the same span (the calling thread's, the budget's stages)

`total` is the process's CPU time from the first spec load to the last source (imports excluded: `import_s`).
Each source's sha256 is compared with its pin in tests/golden/kernel_sources.sha256 (`golden_mismatches`: must
be 0 for a change that claims byte-identical kernels).

    python -m bench.derive_speed [--specs lif,alif] [--set pinned|no-layouts|first-use] [--out DIR] [--label NAME]
                                 [--profile FILE]

`--set first-use`: instead, each spec's two kernels of a first training call (fptt and bptt, float32, its own reset,
the default options), as a new neuron's first use or a test process builds them.

Prints a table and the JSON; writes `derive_speed.json` (or `<label>.json`) under --out. `--profile` writes the
child's cProfile stats (every thread's, merged, in each thread's CPU time) to FILE; the profiler slows the run, so
its times are not the table's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "kernel_sources.sha256"
PHASES = ("load", "parse", "system", "derive", "plans", "cse", "printing", "naming", "describe", "render", "other")


# -- the child -------------------------------------------------------------------------------------------------
def first_use_variants(specs: dict[str, Any]) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """(label, spec, kind, dtype, options) of each spec's first training call: fptt and bptt in float32, the
    default options (labelled as the pinned variant of its own reset)."""
    from autocuda.tools.testing.golden import label

    return [(label(name, kind, "float32", {"reset": spec.reset, "detach_reset": False}), name, kind, "float32", {})
            for name, spec in specs.items() for kind in ("fptt", "bptt")]


class _Phases:
    """CPU time per phase, each phase's own: a wrapped function's time on its thread's clock, less the time of the
    wrapped functions it calls (a stack per thread)."""

    def __init__(self) -> None:
        import threading

        self.spent = dict.fromkeys(PHASES, 0.0)
        self.local = threading.local()

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        inner = getattr(owner, attr)
        setattr(owner, attr, self.timed(inner, phase))

    def timed(self, inner: Any, phase: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = self.local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # the time of the wrapped calls within this one
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = time.thread_time() - start
                self.spent[phase] += elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed
        return wrapper


def _instrument(phases: _Phases) -> None:
    from autocuda.codegen import builder, ckernel, kernels, neuron_kernel, printer
    from autocuda.spec import load, model, system

    phases.wrap(load, "_load_file", "load")
    phases.wrap(model, "_parse_spec_expressions", "parse")
    phases.wrap(system, "_step_system", "system")
    phases.wrap(kernels, "derive", "derive")
    phases.wrap(neuron_kernel, "forward_plan", "plans")
    phases.wrap(neuron_kernel, "backward_plan", "plans")
    phases.wrap(builder, "shared_subexpressions", "cse")
    phases.wrap(printer.CudaPrinter, "__call__", "printing")
    phases.wrap(neuron_kernel, "_text", "naming")
    phases.wrap(kernels, "describe", "describe")
    render = vars(ckernel.CKernel)["full_codes"].fget
    ckernel.CKernel.full_codes = property(phases.timed(render, "render"))  # type: ignore[method-assign, assignment]


def _profiled_threads(profiles: list[Any]) -> None:
    """Profile each symbolic stage's worker thread as well (cProfile sees only the thread it is enabled in)."""
    import cProfile

    from autocuda.spec import budget

    work = budget._Stage._work

    def profiled(self: Any) -> None:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        try:
            work(self)
        finally:
            profile.disable()
            profiles.append(profile)
    budget._Stage._work = profiled  # type: ignore[method-assign]


def child(specs: list[str] | None, which: str, profile_to: str) -> dict[str, Any]:
    import hashlib

    start = time.process_time()
    import sympy  # noqa: F401

    import autocuda
    from autocuda.codegen import kernels
    from autocuda.spec import load
    import_s = time.process_time() - start
    from autocuda.tools.testing import golden

    if which == "pinned":  # the layouts (the tuner's candidates) worked out before the clock starts
        for dtype in golden.DTYPES:
            golden.layouts(dtype)
    phases = _Phases()
    _instrument(phases)
    profiles: list[Any] = []
    if profile_to:
        import cProfile

        _profiled_threads(profiles)
        profiles.append(cProfile.Profile(time.thread_time))
        profiles[-1].enable()
    start, wall = time.process_time(), time.perf_counter()
    names = specs or [name for name, _ in load.list_specs()]  # loads them all
    loaded = {name: load.load_spec(name) for name in names}
    chosen = first_use_variants(loaded) if which == "first-use" else list(golden.variants(loaded.items()))
    texts = {label: kernels.source(loaded[name], kind, dtype, **options)
             for label, name, kind, dtype, options in chosen}
    total, wall = time.process_time() - start, time.perf_counter() - wall
    if profile_to:
        import pstats

        profiles[0].disable()
        pstats.Stats(*profiles).dump_stats(profile_to)
    phases.spent["other"] = total - sum(phases.spent.values())
    pinned = _pins()
    digests = {label: hashlib.sha256(text.encode()).hexdigest() for label, text in texts.items()}
    differ = sorted(label for label, digest in digests.items() if label in pinned and pinned[label] != digest)
    return {"variants": len(texts), "specs": len(names), "total_cpu_s": total, "wall_s": wall, "import_s": import_s,
            "phases_cpu_s": phases.spent, "golden_compared": sum(label in pinned for label in digests),
            "golden_mismatches": differ, "autocuda": str(Path(autocuda.__file__).parent)}


def _pins() -> dict[str, str]:
    """label: sha256 of every pinned source (tests/golden/kernel_sources.sha256: '<digest>  <label>' lines)."""
    pinned = {}
    for line in GOLDEN.read_text().splitlines() if GOLDEN.exists() else ():
        digest, label = line.split("  ", 1)
        pinned[label] = digest
    return pinned


# -- the parent ------------------------------------------------------------------------------------------------
def run(specs: list[str] | None, which: str, profile: Path | None) -> dict[str, Any]:
    """One fresh child with an empty autocuda cache; its result (or its error)."""
    argv = [sys.executable, "-m", "bench.derive_speed", "--child", json.dumps(
        {"specs": specs, "set": which, "profile": str(profile or "")})]
    with tempfile.TemporaryDirectory(prefix="autocuda-derive-speed-") as cache:
        env = dict(os.environ, AUTOCUDA_CACHE_DIR=cache)
        if profile:  # the profiler's own time counts against the budget of the stages it watches
            env["AUTOCUDA_SYMBOLIC_BUDGET"] = "1000"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:500]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(result: dict[str, Any]) -> str:
    spent = result["phases_cpu_s"]
    lines = ["| phase | CPU-s | share |", "| --- | --- | --- |"]
    lines += [f"| {phase} | {spent[phase]:.2f} | {spent[phase] / result['total_cpu_s']:.0%} |" for phase in PHASES]
    lines.append(f"| **total** | **{result['total_cpu_s']:.2f}** | {result['variants']} variants of "
                 f"{result['specs']} specs, {result['wall_s']:.1f} s wall |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", help="shipped specs, comma-separated (default: all)")
    parser.add_argument("--set", default="pinned", choices=("pinned", "no-layouts", "first-use"),
                        help="the pinned variants, those without the layouts, or each spec's fptt and bptt")
    parser.add_argument("--out", type=Path, help="folder for the JSON")
    parser.add_argument("--label", default="derive_speed", help="the JSON's name under --out, and its 'label'")
    parser.add_argument("--profile", type=Path, help="file for the child's cProfile stats (slower: not timed)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        options = json.loads(args.child)
        print(json.dumps(child(options["specs"], options["set"], options["profile"])))
        return 0
    specs = args.specs.split(",") if args.specs else None
    result = run(specs, args.set, args.profile.resolve() if args.profile else None)
    result |= {"label": args.label, "set": args.set, "python": sys.version.split()[0], "cpus": os.cpu_count(),
               "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               "commit": _commit()}
    if "error" not in result:
        print(table(result))
        if result["golden_mismatches"]:
            print(f"{len(result['golden_mismatches'])} sources differ from their golden pins, first: "
                  f"{result['golden_mismatches'][:3]}")
    print(json.dumps(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 1 if "error" in result or result["golden_mismatches"] else 0


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
