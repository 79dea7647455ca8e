"""First use of a new FlexSN core, in fresh processes: cold (empty autocuda cache) and warm (the cache a cold
process left), with where the time goes.

Each measurement is a child process that imports torch, brings the device up, then starts the clock:
`import autocuda.nn`, `FlexSN(core, num_states)` (trace, and map onto a spec: sympy when not cached), the first
forward and the first backward (derive, render, compile and load the kernels: from the disk cache when warm).
The child times the stages by wrapping them (`derive_render_s`: building kernel sources; `compile_s`: NVRTC on a
GPU, the host runner's compiler on a CPU; `load_s`: getting each launchable kernel, from the disk cache or
compiled; `op_backward_s`: autocuda's part of the first backward, the rest being torch's) and says whether sympy
and jinja2 were imported. `cpu_s` is the CPU time of the child itself over the same span and `compiler_cpu_s` that
of the compilers it ran (the host runner's): on a machine shared with other work they move less than the wall
time does. `--warm-torch` first runs the same torch ops around the layer (a product, a sum, a
backward) on other tensors, before the clock, so that torch's own first use (its kernels loaded on first launch,
autograd's device thread) is not counted; the time it took is `torch_warm_s`.

The cores (`--cores`, default all): the shipped LIF and ALIF, an EIF-like core with `exp`, a core of two states
with `clamp` and `torch.where` and an output that is an expression (not the spike nor a state), and a core of
three states. `--profile DIR` writes the cProfile stats of each core's first cold and first warm child there
(`<core>-cold.prof`, `<core>-warm.prof`; the profiler slows them: time without it). `--keep-toolchain` starts
each cold child with what a machine builds once for every neuron already in its cache (the host runner's
precompiled shim, the native call path's library): a new neuron on a machine that used autocuda before; without
it, a cold cache is empty (the first child, which compiles Python's bytecode, runs a core of its own).

    python -m bench.flexsn_first_use [--device cuda] [--cores lif,alif,...] [--repeat 2] [--warm 1]
                                     [--warm-torch] [--keep-toolchain] [--out DIR] [--profile DIR]

Prints a table, the medians per core and cache, and writes `first_use.json` under --out (when given). Targets
(issue 45): cold <= 1.5 s, warm <= 0.15 s on the GPU, median of 5 fresh processes, from `import autocuda.nn` to
the first backward done.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The child: argv = device, core name, warm torch (0 or 1). Prints one JSON line.
CHILD = r"""
import json, os, sys, time
import torch
device, name, warm_torch = torch.device(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
profile_to = sys.argv[4] if len(sys.argv) > 4 else ""
x = (torch.randn(8, 4096, device=device) * 2.0 + 0.5).requires_grad_(True)
g = torch.randn(8, 4096, device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sync()
torch_warm_s = 0.0
if warm_torch:
    start = time.perf_counter()
    other = x.detach().clone().requires_grad_(True)
    (torch.sigmoid(other) * g).sum().backward()
    sync()
    torch_warm_s = time.perf_counter() - start
spent = {"derive_render_s": 0.0, "compile_s": 0.0, "load_s": 0.0, "op_backward_s": 0.0}

def timed(owner, attr, field):
    inner = getattr(owner, attr)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[field] += time.perf_counter() - start
    setattr(owner, attr, wrapper)

def lif(x, v):
    h = v + (x - v) / 2.0
    s = spike(h - 1.0)
    return s, h * (1.0 - s)

def alif(x, v, a):
    h = v + (x - v) / 2.0
    s = spike(h - (1.0 + 0.2 * a))
    return s, h * (1.0 - s), 0.95 * a + s

def eif(x, v):  # exponential integrate-and-fire: an exp of the state
    h = v + (x - v + 0.5 * torch.exp((v - 0.8) / 0.5)) / 2.0
    s = spike(h - 1.0)
    return s, h * (1.0 - s) - 0.1 * s

def clamp_where(x, v, a):  # two states, a clamp, a torch.where, and an output that is an expression
    h = torch.clamp(v + (x - v) / 2.0, -1.0, 4.0)
    s = spike(h - (1.0 + a))
    return s, torch.where(h > 0.0, h, 0.1 * h), h * (1.0 - s), torch.clamp(0.9 * a + 0.1 * s, 0.0, 1.0)

def three_state(x, v, i, a):  # a current, a membrane and an adaptation
    i_new = 0.8 * i + x
    h = v + (i_new - v) / 4.0
    s = spike(h - (1.0 + 0.1 * a))
    return s, h * (1.0 - s), i_new, 0.9 * a + s

if profile_to:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
import resource
def children_cpu():  # the compilers this process ran and waited for (the host runner's, the shim's)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
c0, k0 = time.process_time(), children_cpu()
t0 = time.perf_counter()
import autocuda.nn
from autocuda.spec.surrogate import Sigmoid
t1 = time.perf_counter()
from autocuda import ops
from autocuda.runtime import neuron_launch
from autocuda.toolchain import compile as compiling, launch
timed(neuron_launch.NeuronConfig, "_generate", "derive_render_s")
timed(compiling, "nvrtc_compile", "compile_s")
timed(launch, "kernel_function", "load_s")
timed(ops, "_backward", "op_backward_s")
if device.type == "cpu":  # the host runner: imported only where it runs
    from autocuda.toolchain.host import runner
    timed(runner, "_compile", "compile_s")
    timed(runner, "load_kernel", "load_s")
spike = Sigmoid(4.0)
def primer(x, v):  # a core of no benchmarked kind: the first child's (bytecode, toolchain)
    h = 0.7 * v + x
    s = spike(h - 0.8)
    return s, h - 0.8 * s

core = {"lif": (lif, 1), "alif": (alif, 2), "eif": (eif, 1), "clamp_where": (clamp_where, 2),
        "three_state": (three_state, 3), "primer": (primer, 1)}[name]
layer = autocuda.nn.FlexSN(*core, backend="cuda" if device.type == "cuda" else "host")
t2 = time.perf_counter()
outputs = layer(x)
outputs = outputs if isinstance(outputs, tuple) else (outputs,)
sync()
t3 = time.perf_counter()
sum((o * g).sum() for o in outputs).backward()
sync()
t4 = time.perf_counter()
cpu_s, compiler_cpu_s = time.process_time() - c0, children_cpu() - k0
if profile_to:
    profiler.disable()
    profiler.dump_stats(profile_to)
print(json.dumps({"first_use_s": t4 - t0, "cpu_s": cpu_s, "compiler_cpu_s": compiler_cpu_s,
                  "import_s": t1 - t0, "construct_s": t2 - t1,
                  "first_forward_s": t3 - t2, "first_backward_s": t4 - t3, **spent, "torch_warm_s": torch_warm_s,
                  "kernels_compiled": compiling.stats["compiled"], "kernels_from_disk": compiling.stats["disk"],
                  "sympy": "sympy" in sys.modules, "jinja2": "jinja2" in sys.modules}))
"""

CORES = ("lif", "alif", "eif", "clamp_where", "three_state")  # the cores the child defines
COLUMNS = ("first_use_s", "cpu_s", "compiler_cpu_s",
           "import_s", "construct_s", "first_forward_s", "first_backward_s", "derive_render_s",
           "compile_s", "load_s", "op_backward_s", "torch_warm_s")


def child_env(cache: Path) -> dict[str, str]:
    """An empty (or the previous child's) autocuda cache; Python bytecode written as after an install."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["AUTOCUDA_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def measure(device: str, core: str, cache: Path, label: str, warm_torch: bool = False,
            profile: Path | None = None) -> dict[str, Any]:
    """One fresh child; with `profile`, its cProfile stats of the timed part are written there."""
    argv = [sys.executable, "-c", CHILD, device, core, "1" if warm_torch else "0", str(profile or "")]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=child_env(cache), capture_output=True, text=True, timeout=600)
    row: dict[str, Any] = {"core": core, "cache": label, "process_wall_s": time.perf_counter() - start}
    if proc.returncode == 0:
        row |= json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
    return row


def toolchain_parts(cache: Path) -> list[Path]:
    """What a cache holds for the machine rather than for a neuron: the host runner's precompiled shim
    (`host/shim-*`) and the native call path's library (`host/native-*`)."""
    host = cache / "host"
    return sorted([*host.glob("shim-*"), *host.glob("native-*")]) if host.is_dir() else []


def copy_toolchain(parts: list[Path], cache: Path) -> None:
    """The toolchain parts into an empty cache (private folders and files, as autocuda writes them)."""
    host = cache / "host"
    host.mkdir(mode=0o700, parents=True)
    for part in parts:
        if part.is_dir():
            shutil.copytree(part, host / part.name)
        else:
            shutil.copy2(part, host / part.name)


def run(device: str, cores: list[str], repeat: int, warm: int = 1, warm_torch: bool = False,
        profile: Path | None = None, keep_toolchain: bool = False) -> list[dict[str, Any]]:
    """`repeat` times per core: a cold child, then `warm` children on the cache it left. With `profile` (a
    folder), the first cold and the first warm child of each core write `<core>-<cache>.prof` there. With
    `keep_toolchain`, a cold cache holds what a machine builds once for every neuron (`toolchain_parts`), from a
    first child of another core: cold is then a new neuron's first use on a machine that used autocuda before."""
    rows = []
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)

    def profiled(core: str, label: str, first: bool) -> Path | None:
        return profile / f"{core}-{label}.prof" if profile is not None and first else None

    # One child first compiles every module's bytecode (as `pip install` does), so that "cold" means an empty
    # autocuda cache, not Python compiling sympy from source.
    with tempfile.TemporaryDirectory(prefix="autocuda-first-use-") as first:
        primer = Path(first) / "bytecode"
        measure(device, "primer", primer, "bytecode")
        if keep_toolchain and device.startswith("cuda"):  # the native library, built in the background there
            subprocess.run([sys.executable, "-m", "autocuda.call.native", "--wait"], env=child_env(primer),
                           capture_output=True, timeout=900)
        parts = toolchain_parts(primer) if keep_toolchain else []
        for core in cores:
            for i in range(repeat):
                with tempfile.TemporaryDirectory(prefix="autocuda-first-use-") as tmp:
                    cache = Path(tmp) / "autocuda"
                    if parts:
                        copy_toolchain(parts, cache)
                    rows.append(measure(device, core, cache, "cold", warm_torch, profiled(core, "cold", i == 0)))
                    rows += [measure(device, core, cache, "warm", warm_torch,
                                     profiled(core, "warm", i == 0 and j == 0)) for j in range(warm)]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["core", "cache", *COLUMNS, "compiled", "sympy", "jinja2"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['core']} | {r['cache']} | error: {r['error']} |")
            continue
        cells = [r["core"], r["cache"], *(f"{r[c]:.3f}" for c in COLUMNS), str(r["kernels_compiled"]),
                 "yes" if r["sympy"] else "no", "yes" if r["jinja2"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def medians(rows: list[dict[str, Any]]) -> str:
    """The median of each column over the rows of each (core, cache)."""
    head = ["core", "cache", "n", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["core"], r["cache"]), []).append(r)
    for (core, cache), group in groups.items():
        cells = [core, cache, str(len(group)), *(f"{statistics.median(r[c] for r in group):.4f}" for c in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (NVRTC kernels) or cpu (the host runner)")
    parser.add_argument("--cores", default=",".join(CORES), help=f"of {', '.join(CORES)}")
    parser.add_argument("--repeat", type=int, default=2, help="cold children per core")
    parser.add_argument("--warm", type=int, default=1, help="warm children after each cold one")
    parser.add_argument("--warm-torch", action="store_true",
                        help="run torch's own ops once before the clock (their first use is not counted)")
    parser.add_argument("--out", type=Path, help="folder for first_use.json")
    parser.add_argument("--keep-toolchain", action="store_true",
                        help="cold caches hold the machine's toolchain parts (the host shim's precompiled header, "
                             "the native library): a new neuron on a machine that used autocuda before")
    parser.add_argument("--profile", type=Path,
                        help="folder for cProfile stats of the first cold and warm child of each core (they run "
                             "slower under the profiler: time without it)")
    args = parser.parse_args(argv)
    rows = run(args.device, args.cores.split(","), args.repeat, args.warm, args.warm_torch, args.profile,
               args.keep_toolchain)
    print(table(rows))
    print(medians(rows))
    result = {"device": args.device, "rows": rows, "python": sys.version.split()[0], "warm_torch": args.warm_torch,
              "keep_toolchain": args.keep_toolchain,
              "what": "seconds from `import autocuda.nn` (torch imported, device up) to the first backward done"}
    if args.device.startswith("cuda"):
        import torch

        result["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first_use.json").write_text(json.dumps(result, indent=1) + "\n")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
