"""Does the default set of tests/test_neuron_compile.py run every line and branch of the kernel generator that the
full set runs? Renders one set under a tracer and prints its arcs (line -> next line, per code object) in the
generator's modules and templates as JSON; `compare` tells the arcs of the full set missing from the default set.

usage (from the repository root; each set in a fresh process, so no cache hides an arc):
    PYTHONPATH=$PWD:tests python branches.py record default > default.json
    PYTHONPATH=$PWD:tests python branches.py record full > full.json
    python branches.py compare default.json full.json
    PYTHONPATH=$PWD:tests python branches.py specs     # per spec: arcs of its own-reset kernels and of the rest
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path.cwd()
TRACED = [ROOT / "autocuda" / "codegen", ROOT / "autocuda" / "spec", ROOT / "templates",
          ROOT / "autocuda" / "kernels.py", ROOT / "autocuda" / "dtypes.py", ROOT / "autocuda" / "layout.py",
          ROOT / "autocuda" / "surrogate.py", ROOT / "autocuda" / "cfunction.py"]
arcs: set[tuple[str, int, int, int]] = set()  # file, first line of the code object, from line, to line


def _traced(filename: str) -> bool:
    return any(filename == str(p) or filename.startswith(str(p) + "/") for p in TRACED)


def _tracer(frame: FrameType, event: str, arg: Any):
    if not _traced(frame.f_code.co_filename):
        return None
    code, last = frame.f_code, [-1]

    def local(frame: FrameType, event: str, arg: Any):
        if event in ("line", "return"):
            line = frame.f_lineno if event == "line" else 0
            arcs.add((code.co_filename.replace(str(ROOT) + "/", ""), code.co_firstlineno, last[0], line))
            last[0] = line
        return local
    return local


def render(variants: list) -> None:
    from autocuda.codegen.kernels import neuron_kernel
    from autocuda.spec.model import load_spec

    for name, kind, dtype, options in variants:
        neuron_kernel(load_spec(name), kind, dtype, **dict(options)).full_codes  # noqa: B018


def chosen(which: str) -> list:
    import test_neuron_compile as t

    from autocuda.codegen.dtypes import DTYPES

    pick = t.full_set if which == "full" else t.default_set
    return [(name, kind, dtype, options) for dtype in DTYPES for name, kind, options in pick(dtype)]


def record(variants: list) -> set:
    arcs.clear()
    sys.settrace(_tracer)
    threading.settrace(_tracer)  # spec.budget runs each stage in a worker thread
    try:
        render(variants)
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    return set(arcs)


def main() -> None:
    if sys.argv[1] == "record":
        variants = chosen(sys.argv[2])
        json.dump({"variants": len(variants), "arcs": sorted(record(variants))}, sys.stdout)
    elif sys.argv[1] == "compare":
        default, full = (json.loads(Path(p).read_text()) for p in sys.argv[2:4])
        missing = {tuple(a) for a in full["arcs"]} - {tuple(a) for a in default["arcs"]}
        extra = {tuple(a) for a in default["arcs"]} - {tuple(a) for a in full["arcs"]}
        print(f"default: {default['variants']} variants, {len(default['arcs'])} arcs; "
              f"full: {full['variants']} variants, {len(full['arcs'])} arcs")
        print(f"arcs of the full set missing from the default set: {len(missing)}; in default only: {len(extra)}")
        for arc in sorted(missing):
            print("  missing", arc)
    elif sys.argv[1] == "specs":
        import test_neuron_compile as t

        from autocuda.codegen.dtypes import DTYPES
        from autocuda.codegen.neuron_kernel import KERNELS
        from autocuda.spec.model import list_specs

        seen: set = set()
        own: dict[str, set] = {}
        for name, _ in list_specs():
            variants = [(n, k, d, o) for d in DTYPES for n, k, o in list(t.spec_variants(name, d))[:len(KERNELS)]]
            own[name] = record(variants)
            seen |= own[name]
        base = set(seen)
        for name, _ in list_specs():
            variants = [(n, k, d, o) for d in DTYPES for n, k, o in list(t.spec_variants(name, d))[len(KERNELS):]]
            rest = record(variants) - base
            print(json.dumps({"spec": name, "own": len(own[name]), "rest_new": sorted(rest)}))


if __name__ == "__main__":
    main()
