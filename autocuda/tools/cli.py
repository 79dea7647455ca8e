"""The `autocuda` command: list, show, check, new, tour, plot, cache, native. (The benchmark is the repository's own
package, `python -m bench` from a checkout: it imports autocuda, never the other way round.)"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..base.version import __version__
from ..codegen.dtypes import DTYPES
from ..codegen.neuron_kernel import KERNELS
from ..spec.load import spec_argument

_SKELETON = '''# {name}: a neuron for autocuda. Every field is documented in docs/spec-format.md.
name = "{name}"
doc = "Leaky integrate-and-fire with a slow adaptation current (edit me)"
# h: the membrane after charging, from the input x, the states and the parameters
charge = "v + (x - (v - v_reset) - w) / tau"
threshold = "v_threshold"      # may use states: adaptive thresholds are fine
reset = "hard"                 # hard (to v_reset) | soft (subtract the threshold) | none

[params]                       # a number: a runtime scalar with that default
tau = 2.0
tau_w = 10.0
b = 0.1
v_threshold = 1.0
v_reset = 0.0

[states]                       # the first state is the membrane; initial values: numbers or parameters
v = "v_reset"
w = 0.0

[updates]                      # other states after firing; may use h and the spike s
w = "w - w / tau_w + b * s"

[surrogate]                    # the gradient used for the spike in backward
name = "Sigmoid"
alpha = 4.0
'''


def _highlight(code: str) -> str:
    if not sys.stdout.isatty():
        return code
    try:
        from pygments import highlight
        from pygments.formatters import TerminalFormatter
        from pygments.lexers import CudaLexer
    except ImportError:
        return code
    return highlight(code, CudaLexer(), TerminalFormatter())


def cmd_list(args: argparse.Namespace) -> int:
    from ..spec.load import list_specs

    rows = list_specs()
    width = max(len(n) for n, _ in rows)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    spec = spec_argument(args.spec)
    code = spec.source(args.kernel, args.dtype, reset=args.reset, detach_reset=args.detach_reset,
                       store_state_seq=args.store_state_seq)
    print(_highlight(code), end="" if code.endswith("\n") else "\n")
    return 0


def _regular_file(path: Path, what: str) -> None:
    """Refuse to write `what` into an existing path that is no regular file: a FIFO blocks the write until a reader
    comes, a directory or a device fails with an unclear error, or none."""
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "a FIFO" if path.is_fifo() else "a device or socket"
        raise ValueError(f"{what}: {path} is not a regular file ({kind}); name a regular file to write")


def cmd_new(args: argparse.Namespace) -> int:
    from ..spec.names import spec_name_problem

    name = Path(args.name).stem
    problem = spec_name_problem(name)  # the spec's own rule: `show` and `check` load the skeleton by it
    if problem:
        raise ValueError(f"spec name {name!r}: {problem}")
    path = Path(args.name if args.name.endswith(".toml") else f"{args.name}.toml")
    _regular_file(path, "name")
    if path.exists() and not args.force:
        raise FileExistsError(f"{path} exists (use --force to overwrite)")
    path.write_text(_SKELETON.format(name=name))
    print(f"wrote {path}; try: autocuda show {path} && autocuda check {path}")
    return 0


def _best_backend() -> str:
    import torch

    from ..toolchain import nvrtc

    return "cuda" if torch.cuda.is_available() and nvrtc.found() else "host"


def _backend(asked: str | None) -> str:
    """The backend asked for, or the best one here; 'cuda' where it cannot run says what to do instead."""
    if asked != "cuda":
        return asked or _best_backend()
    import torch

    from ..toolchain import nvrtc

    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is built without CUDA"
    elif not torch.cuda.is_available():
        why = "no CUDA device is visible"
    elif not nvrtc.found():
        why = "NVRTC cannot be loaded (pip install -e '.[cuda12]' or '.[cuda13]' adds it)"
    else:
        return asked
    raise RuntimeError(f"--backend cuda: {why}; run on a GPU, or use --backend host (the same generated CUDA "
                       f"compiled for this CPU), or leave --backend out to pick the best here")


# The tour's quick check: the spec's own reset, float32 and float16 storage (every dtype is in `check --all`).
QUICK = {"dtypes": ("float32", "float16"), "detach": (False,)}


def _check_rows(names: Sequence[str], backend: str, quick: bool, bar: bool = True
                ) -> list[tuple[str, str, str, float]]:
    from ..base.progress import progress
    from .testing import check_spec

    rows = []
    for name in progress(names, desc="check", unit="spec", leave=False, disable=not bar):
        start = time.perf_counter()
        spec = spec_argument(name)
        options = {**QUICK, "resets": (spec.reset,), "examples": 2} if quick else {"examples": 3}
        report = check_spec(spec, backend=backend, raise_on_failure=False, **options)
        result = "pass" if report.passed else f"FAIL ({report.summary()})"
        rows.append((name, f"{len(report.cases)} cases", result, time.perf_counter() - start))
    return rows


def _print_table(rows: Sequence[tuple[str, str, str, float]], header: Sequence[str]) -> None:
    cells = [list(header)] + [[r[0], r[1], r[2], f"{r[3]:.1f} s"] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def cmd_check(args: argparse.Namespace) -> int:
    from ..spec.load import list_specs

    names = [n for n, _ in list_specs()] if args.all else args.specs
    if not names:
        raise ValueError("name a spec (or a .toml file), or pass --all")
    backend = _backend(args.backend)
    rows = _check_rows(names, backend, args.quick)
    print(f"backend: {backend}")
    _print_table(rows, ("spec", "checked", "result", "time"))
    return 0 if all(r[2] == "pass" for r in rows) else 1


def cmd_tour(args: argparse.Namespace) -> int:
    """Every shipped spec: derive and render all kernels in all dtypes, then check them on the best backend."""
    from ..base.progress import progress
    from ..codegen.kernels import neuron_kernel
    from ..spec.load import list_specs

    backend = _backend(args.backend)
    print(f"autocuda {__version__}: generating and checking every shipped neuron (backend: {backend})\n")
    rows = []
    names = [name for name, _ in list_specs()]
    for name in progress(names, desc="tour", unit="spec", leave=False):
        start = time.perf_counter()
        spec = spec_argument(name)
        count = sum(1 for k in KERNELS for d in DTYPES if neuron_kernel(spec, k, d).full_codes)
        checked = _check_rows([name], backend, quick=True, bar=False)[0]
        rows.append((name, f"{count} kernels", checked[2], time.perf_counter() - start))
    _print_table(rows, ("model", "kernels", "check vs reference", "time"))
    return 0 if all(r[2] == "pass" for r in rows) else 1


def cmd_cache(args: argparse.Namespace) -> int:
    """What the disk cache holds (specs, kernel records, binaries, tuned layouts, host libraries), or clear it."""
    from ..toolchain import store

    if args.clear:
        print(f"removed {store.clear()} entries from {store.root()}")
        return 0
    print(f"autocuda cache: {store.root()} (set AUTOCUDA_CACHE_DIR to move it)")
    for kind, entries, size in store.usage() or [("(empty)", 0, 0)]:
        print(f"  {kind:<9} {entries:6d} entries  {size / 2**20:8.1f} MiB")
    return cmd_native(argparse.Namespace(action="status"))


def cmd_native(args: argparse.Namespace) -> int:
    """Where the native call path's library stands, or (build) build it now into the cache."""
    from ..call import native

    if args.action == "build" and native.build_into_cache(wait=args.wait) != 0:
        return 1  # why is on stderr: a failed build, or a build of another process's not waited for
    print(f"native library: {native.library_state()}")
    return 0


def _assignment(text: str) -> tuple[str, float]:
    """`--param NAME=NUMBER` as (name, number)."""
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not name.strip() or number is None:
        raise ValueError(f"--param: expected NAME=NUMBER (e.g. tau=5), got {text!r}")
    return name.strip(), number


def cmd_plot(args: argparse.Namespace) -> int:
    """One neuron of a spec driven by a test input (or its f-I curve with --fi), drawn into a file."""
    from . import plot

    spec = spec_argument(args.spec)
    plot.pyplot()  # the missing-matplotlib error before any work
    if args.steps is not None and not 0 < args.steps <= plot.MAX_STEPS:
        raise ValueError(f"--steps: expected a number of time steps > 0 and at most {plot.MAX_STEPS}, "
                         f"got {args.steps}")
    if not abs(args.amplitude) <= plot.MAX_AMPLITUDE:  # named as the option, before any work
        raise ValueError(f"--amplitude: expected a finite number of magnitude at most {plot.MAX_AMPLITUDE:g}, "
                         f"got {args.amplitude}")
    if args.seed not in plot.SEEDS:
        raise ValueError(f"--seed: expected an integer from -2**63 to 2**64 - 1 (torch's seeds), got {args.seed}")
    what = "fi" if args.fi else args.input
    out = Path(args.out or f"{spec.name}-{what}.png")
    if out.suffix.lower() not in plot.FORMATS:
        raise ValueError(f"--out: expected a file ending in {', '.join(plot.FORMATS)}, got {str(out)!r}")
    _regular_file(out, "--out")
    params = dict(_assignment(text) for text in args.param)
    if args.fi:
        figure = plot.plot_fi(spec, None, T=200 if args.steps is None else args.steps, **params)
    else:
        figure = plot.response(spec, args.input, T=100 if args.steps is None else args.steps,
                               amplitude=args.amplitude, seed=args.seed, **params)
    print(f"wrote {plot.save(figure, out)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autocuda", description=__doc__)
    parser.add_argument("--version", action="version", version=f"autocuda {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="shipped neuron specs").set_defaults(run=cmd_list)
    show = sub.add_parser("show", help="print the generated CUDA of a spec")
    show.add_argument("spec", help="shipped spec name or .toml path")
    show.add_argument("--kernel", choices=KERNELS, default="fptt", help="which kernel (default fptt: forward "
                      "through time; bptt: backward; step-*: one time step)")
    show.add_argument("--dtype", choices=list(DTYPES), default="float32", help="storage dtype (default float32)")
    show.add_argument("--reset", choices=("hard", "soft", "none"), default=None,
                      help="the reset rule (default: the spec's)")
    show.add_argument("--detach-reset", action="store_true", help="no gradient through the spike in the reset")
    show.add_argument("--store-state-seq", action="store_true", help="also write every state's sequence")
    show.set_defaults(run=cmd_show)
    check = sub.add_parser("check", help="property-test the generated kernels against the reference")
    check.add_argument("specs", nargs="*", help="shipped spec names or .toml paths")
    check.add_argument("--all", action="store_true", help="check every shipped spec (instead of naming them)")
    check.add_argument("--backend", choices=("cuda", "host"), default=None,
                       help="cuda (a GPU) or host (the generated CUDA compiled for the CPU); default: the best here")
    check.add_argument("--quick", action="store_true", help="fewer examples")
    check.set_defaults(run=cmd_check)
    new = sub.add_parser("new", help="write a commented spec skeleton")
    new.add_argument("name", help="the spec's name, or a path ending in NAME.toml; the name is a letter, then "
                     "letters, digits or single '_', 64 characters at most")
    new.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    new.set_defaults(run=cmd_new)
    tour = sub.add_parser("tour", help="generate and check every shipped spec; print a table")
    tour.add_argument("--backend", choices=("cuda", "host"), default=None,
                      help="cuda (a GPU) or host (the generated CUDA compiled for the CPU); default: the best here")
    tour.set_defaults(run=cmd_tour)
    cache = sub.add_parser("cache", help="show what autocuda's disk cache holds, or --clear it")
    cache.add_argument("--clear", action="store_true", help="remove every cached entry")
    cache.set_defaults(run=cmd_cache)
    native = sub.add_parser("native", help="where the native call path's library stands, or build it now")
    native.add_argument("action", nargs="?", choices=("status", "build"), default="status",
                        help="status (the default): built, loaded, building or unavailable, and why; build: build "
                        "it into the cache now (ahead of a process's first CUDA call)")
    native.add_argument("--wait", action="store_true", help="build: wait for a build another process is running "
                        "(by default it leaves that build alone and says so)")
    native.set_defaults(run=cmd_native)
    plot = sub.add_parser("plot", help="draw a spec's states and spikes under a test input, or its f-I curve "
                          "(needs matplotlib)")
    plot.add_argument("spec", help="shipped spec name or .toml path")
    plot.add_argument("--input", choices=("step", "ramp", "noise"), default="step", help="the test input")
    plot.add_argument("--fi", action="store_true", help="the firing rate against constant input instead")
    plot.add_argument("--out", default=None, help="FILE.png, .svg or .pdf (default: SPEC-INPUT.png)")
    plot.add_argument("--steps", type=int, default=None, help="time steps (default: 100; 200 with --fi; at most "
                      "10000)")
    plot.add_argument("--amplitude", type=float, default=1.5, help="the input's level (step, noise mean; a ramp "
                      "goes to twice it)")
    plot.add_argument("--seed", type=int, default=0, help="seed of the noise input")
    plot.add_argument("--param", action="append", default=[], metavar="NAME=NUMBER",
                      help="a parameter of the spec (repeatable), e.g. --param tau=5")
    plot.set_defaults(run=cmd_plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if sys.stdout is None:  # started with stdout closed (`autocuda list >&-`): said "'NoneType' object has no ..."
        print("autocuda: error: standard output is closed: nowhere to write (nothing was done)", file=sys.stderr)
        return 2
    try:
        code = args.run(args)
        sys.stdout.flush()  # a reader gone raises here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # stdout's reader left (`autocuda tour | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1
    except Exception as error:  # one clear line for users; the traceback with --debug
        if args.debug:
            raise
        # never an empty line: an error without text (a MemoryError) is named by its class
        print(f"autocuda: error: {str(error) or type(error).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
