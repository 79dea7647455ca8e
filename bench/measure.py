"""How the benchmark measures: the clock, the copy bandwidth (the floor), the checks against the eager loop, and
the runner of the four parts (speed, memory, host overhead, first use).

Speed: CUDA events around one call (median after warm-up, L2 flushed before each repetition, the host's launch
latency covered by a GPU-side wait: see `Clock`); ours is checked against the eager loop in float32 before it is
timed. Memory: bytes per neuron-step kept from forward to backward, and the peak of a training step. Host
overhead: wall time per call of a tiny problem. First use: import to first backward in a fresh process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

import autocuda
from autocuda.base.progress import progress
from autocuda.toolchain import nvrtc

from .report import count, fmt
from .systems import Skip, SpikingJelly, compiled, eager, ours, version
from .workloads import DTYPES, MODES, WORKLOADS, Case, Forward, States, Tensor, Workload, call, dtype_name, run_loop

HOST_ROUNDS = 5  # of the host-overhead benchmark's calls: it reports the median round
# The host benchmark's calls: (mode, autograd's multithreading). By default torch runs the backward of CUDA nodes on
# a worker thread per device, and each backward hands work to that thread and back;
# `torch.autograd.set_multithreading_enabled(False)` keeps backward on the calling thread. Training is timed both
# ways, for every system.
HOST_CALLS = (("inference", True), ("training", True), ("training", False))
ACCESSES = {"inference": 2, "training": 6}  # element accesses per neuron-step that the floor counts
# The timed calls ask for spike_seq alone, as the floor counts: ours and torch.compile's loop then write no final
# state. SpikingJelly's functions return theirs regardless. Our final states are still checked, by a call that
# returns them.
TIMED_FINAL_STATES = False
MEMORY_WORKLOADS, MEMORY_DTYPES = ("lif", "qif", "izhikevich", "alif"), ("float32", "float16")
SPIKE_AGREEMENT, STATE_AGREEMENT, GRAD_COSINE = 0.999, 0.999, 0.99
STATE_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # rtol = atol, final states


# -- timing -------------------------------------------------------------------------------------------------
class Clock:
    """Median time of a callable: CUDA events on a GPU (L2 flushed before each repetition), else wall time.

    Before the start event the GPU also waits `HOST_COVER_CYCLES` (about a millisecond): the host enqueues the
    call meanwhile, so the events time the device from the call's first kernel to its last (gaps the host
    leaves between them included) rather than the host's Python up to its first launch, which the
    host-overhead benchmark measures on its own. Every system is timed the same way."""

    HOST_COVER_CYCLES = 2_000_000

    def __init__(self, device: torch.device, quick: bool):
        self.device, self.cuda = device, device.type == "cuda"
        self.warmup, self.min_reps, self.max_reps, self.budget_ms = (1, 1, 3, 50.0) if quick else (3, 3, 20, 250.0)
        self.flush_buffer = torch.empty(64 << 20, dtype=torch.int32, device=device) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def once(self, fn: Callable[[], Any]) -> float:
        """One call, in ms."""
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        self.flush_buffer.zero_()  # 256 MiB written: what the call reads does not start in L2
        torch.cuda._sleep(self.HOST_COVER_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median(self, fn: Callable[[], Any], max_call_s: float | None = None) -> float:
        """Warm-up (cut short for slow calls), then repetitions within the time budget: the median in ms."""
        last = self.once(fn)
        if max_call_s is not None and last > max_call_s * 1e3:
            raise Skip(f"{last / 1e3:.1f} s per call > {max_call_s:g} s")
        for _ in range(self.warmup - 1):
            if last > self.budget_ms:
                break
            last = self.once(fn)
        reps = min(self.max_reps, max(self.min_reps, int(self.budget_ms / max(last, 1e-3))))
        return statistics.median(self.once(fn) for _ in range(reps))

    def first(self, fn: Callable[[], Any]) -> float:
        """Seconds of one call (a first call: compile time included)."""
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start


def copy_bandwidth(clock: Clock, quick: bool) -> float:
    """Bytes per second of a device-to-device copy (bytes read + written)."""
    numel = (16 << 20 if quick or not clock.cuda else 512 << 20) // 4
    src = torch.rand(numel, device=clock.device)
    dst = torch.empty_like(src)
    ms = clock.median(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


# -- checks against the eager loop ----------------------------------------------------------------------------
@dataclasses.dataclass
class Reference:
    """The eager loop in float32 on the case's (rounded) inputs, with the gradients of the training loss."""

    spikes: Tensor
    finals: States
    grads: tuple[Tensor | None, ...]

    @staticmethod
    def of(case: Case) -> Reference:
        w = case.workload
        x = case.x.detach().float().requires_grad_(True)
        tensors = {k: v.detach().float().requires_grad_(True) for k, v in case.tensors.items()}
        states = tuple(s.float() for s in case.states)
        spikes, finals = run_loop(w.step, x, states, {**w.params, **tensors})
        grads = torch.autograd.grad(spikes, [x, *tensors.values()], case.g.float(), allow_unused=True)
        return Reference(spikes.detach(), tuple(f.detach() for f in finals), grads)


def check(case: Case, forward: Forward, ref: Reference) -> tuple[str, dict[str, float]]:
    """'ok', 'FAIL ...' (spikes or final states disagree) or 'warn ...' (gradients), and the figures."""
    if case.training:
        spikes, finals = forward()
        grads = torch.autograd.grad(spikes, case.grad_inputs, case.g, allow_unused=True)
    else:
        with torch.no_grad():
            spikes, finals = forward()
        grads = ()
    tol = STATE_TOL[case.dtype]
    figures = {"spike_agreement": (spikes.float() == ref.spikes).float().mean().item(),
               "spike_rate": ref.spikes.mean().item()}
    for i, (final, expected) in enumerate(zip(finals, ref.finals)):
        close = torch.isclose(final.float(), expected, rtol=tol, atol=tol)
        figures[f"state{i}_close"] = close.float().mean().item()
        figures[f"state{i}_max_abs_err"] = (final.float() - expected).abs().max().item()
    if grads and grads[0] is not None and ref.grads[0] is not None:
        figures["grad_x_cosine"] = _cosine(grads[0], ref.grads[0])
    for name, got, expected in zip(case.tensors, grads[1:], ref.grads[1:]):
        if got is not None and expected is not None:
            figures[f"grad_{name}_rel_err"] = ((got.float() - expected).abs() / expected.abs().clamp_min(1e-12)).item()
    agreement = figures["spike_agreement"]
    problems = [f"spikes {100 * agreement:.2f}%"] if agreement < SPIKE_AGREEMENT else []
    problems += [f"state {100 * v:.2f}%" for k, v in figures.items() if k.endswith("_close") and v < STATE_AGREEMENT]
    if problems:
        return "FAIL " + ", ".join(problems), figures
    if figures.get("grad_x_cosine", 1.0) < GRAD_COSINE:
        return f"warn grad cos {figures['grad_x_cosine']:.3f}", figures
    return "ok", figures


def _cosine(a: Tensor, b: Tensor) -> float:
    a, b = a.float().flatten(), b.float().flatten()
    norms = a.norm() * b.norm()
    return 1.0 if norms.item() == 0 and torch.equal(a, b) else (a @ b / norms).item()


# -- speed -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    workload: str
    spec: str
    dtype: str
    mode: str
    T: int
    N: int
    floor_ms: float
    ours_ms: float | None = None
    sj_ms: float | None = None
    compile_ms: float | None = None
    eager_ms: float | None = None
    compile_s: float | None = None           # time of the first compiled call (the compile)
    compile_form: str | None = None          # "loop": the whole loop compiled; "step": the step, looped in Python
    check: str = "–"
    check_figures: dict[str, float] = dataclasses.field(default_factory=dict)
    sj_check: str | None = None
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # system -> why it has no time

    def derived(self) -> dict[str, float | None]:
        def ratio(peer: float | None) -> float | None:
            return peer / self.ours_ms if peer and self.ours_ms else None
        return {"pct_floor": 100 * self.floor_ms / self.ours_ms if self.ours_ms else None,
                "x_sj": ratio(self.sj_ms), "x_compile": ratio(self.compile_ms), "x_eager": ratio(self.eager_ms)}


@dataclasses.dataclass
class Config:
    device: torch.device
    workloads: list[Workload]
    dtypes: list[torch.dtype]
    shapes: list[tuple[int, int]]
    parts: list[str]
    quick: bool
    peers: bool
    out: Path
    compile_budget_s: float
    compile_max_t: int
    eager_max_call_s: float
    first_use_spec: str
    seed: int
    resume: bool = False
    modes: tuple[str, ...] = MODES


class Runner:
    """Holds what the parts share: the clock, the copy bandwidth, SpikingJelly, the compile time spent."""

    def __init__(self, cfg: Config):
        self.cfg, self.started = cfg, time.perf_counter()
        self.clock = Clock(cfg.device, cfg.quick)
        self.sj = SpikingJelly.load(cfg.peers)
        self.bandwidth = copy_bandwidth(self.clock, cfg.quick)
        self.compile_spent = 0.0
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.progress = cfg.out / "progress.jsonl"  # every result as it comes: a run cut short keeps them
        self.kept = _kept_speed_rows(self.progress) if cfg.resume else {}
        self.progress.write_text("".join(json.dumps({"part": "speed", **r}) + "\n" for r in self.kept.values()))

    def record(self, part: str, row: Mapping[str, Any]) -> None:
        with self.progress.open("a") as f:
            f.write(json.dumps({"part": part, **row}, default=str) + "\n")
        if part != "speed":  # speed rows are logged as a line of the table
            self.log(f"{part}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in row.items()))

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f} s] {text}", file=sys.stderr, flush=True)

    def floor_ms(self, dtype: torch.dtype, mode: str, steps: int, neurons: int) -> float:
        nbytes = steps * neurons * ACCESSES[mode] * torch.empty((), dtype=dtype).element_size()
        return nbytes / self.bandwidth * 1e3

    def measure(self, row: Row, system: str, make: Callable[[], Callable[[], Any]],
                max_call_s: float | None = None) -> None:
        """Time `make()`'s callable into row.<system>_ms, or note why there is no time."""
        try:
            setattr(row, f"{system}_ms", self.clock.median(make(), max_call_s))
        except Exception as error:  # noqa: BLE001 - a failure is a table entry, not the end of the run
            row.notes[system] = why(error)
        finally:
            if self.clock.cuda:
                torch.cuda.empty_cache()

    def compile_skip(self, w: Workload, steps: int) -> str | None:
        cfg = self.cfg
        if not cfg.peers:
            return "--no-peers"
        if w.no_compile:
            return w.no_compile
        if cfg.quick:
            return "--quick"
        if self.compile_spent > cfg.compile_budget_s:
            return f"compile budget ({cfg.compile_budget_s:g} s) spent"
        return None

    def compile_call(self, case: Case, row: Row) -> Callable[[], Any]:
        reason = self.compile_skip(case.workload, case.x.shape[0])
        if reason:
            raise Skip(reason)
        row.compile_form = "loop" if case.x.shape[0] <= self.cfg.compile_max_t else "step"
        fn = call(case, compiled(case, whole_loop=row.compile_form == "loop", final_states=TIMED_FINAL_STATES))
        row.compile_s = self.clock.first(fn)
        self.compile_spent += row.compile_s
        return fn

    # -- the parts ----------------------------------------------------------------------------------------
    def speed(self) -> list[Row]:
        rows = []
        # float32 first: if the compile budget runs out, it is on other dtypes
        cases = [(w, dtype, shape) for dtype in self.cfg.dtypes for w in self.cfg.workloads
                 for shape in self.cfg.shapes]
        for w, dtype, (steps, neurons) in progress(cases, desc="speed", unit="case"):
            rows += self.speed_shape(w, dtype, steps, neurons)
        order = {w.key: i for i, w in enumerate(self.cfg.workloads)}
        shapes = {s: i for i, s in enumerate(self.cfg.shapes)}
        dtypes = {dtype_name(d): i for i, d in enumerate(self.cfg.dtypes)}
        return sorted(rows, key=lambda r: (order[r.spec], shapes[(r.T, r.N)], dtypes[r.dtype], MODES.index(r.mode)))

    def speed_shape(self, w: Workload, dtype: torch.dtype, steps: int, neurons: int) -> list[Row]:
        kept = [self.kept.get((w.key, dtype_name(dtype), mode, steps, neurons)) for mode in self.cfg.modes]
        if all(kept):  # measured by the run this one resumes
            self.log(f"kept from {self.progress}: {w.label} {dtype_name(dtype)} ({steps}, {neurons})")
            fields = [f.name for f in dataclasses.fields(Row)]
            return [Row(**{k: r[k] for k in fields}) for r in kept]
        data = Case.draw(w, dtype, steps, neurons, self.cfg.device)
        ref = Reference.of(data)
        return [self.speed_row(data.mode(mode == "training"), ref) for mode in self.cfg.modes]

    def speed_row(self, case: Case, ref: Reference) -> Row:
        w, (steps, neurons), mode = case.workload, case.x.shape, MODES[case.training]
        row = Row(w.label, w.key, dtype_name(case.dtype), mode, steps, neurons,
                  self.floor_ms(case.dtype, mode, steps, neurons))
        try:
            row.check, row.check_figures = check(case, ours(case), ref)
            if row.check == "ok" and not TIMED_FINAL_STATES:  # the call timed: its spikes and gradients
                row.check = check(case, ours(case, final_states=False), ref)[0]
        except Exception as error:  # noqa: BLE001
            row.check = f"error: {first_line(error)}"
        self.measure(row, "ours", lambda: call(case, ours(case, final_states=TIMED_FINAL_STATES)))
        if self.sj.functional is not None and (w.sj is not None or w.flexsn is not None):
            try:
                row.sj_check = check(case, self.sj.forward(case), ref)[0]
            except Exception as error:  # noqa: BLE001 - the timing below reports it
                row.sj_check = f"error: {first_line(error)}"
        self.measure(row, "sj", lambda: call(case, self.sj.forward(case)))
        if self.cfg.peers:
            self.measure(row, "eager", lambda: call(case, eager(case)), self.cfg.eager_max_call_s)
        else:
            row.notes["eager"] = "skipped: --no-peers"
        self.measure(row, "compile", lambda: self.compile_call(case, row))
        self.log(progress_line(row))
        self.record("speed", dataclasses.asdict(row) | row.derived())
        return row

    def memory(self) -> dict[str, Any]:
        """Bytes per neuron-step of a training step: held between forward and backward (less the outputs),
        and the peak over forward + backward, above what was allocated before the step."""
        if not self.clock.cuda:
            return {"note": "skipped: needs a CUDA device (torch.cuda memory statistics)", "rows": []}
        steps, neurons = (64, 64 << 10) if self.cfg.quick else (64, 1 << 20)
        chosen = {w.key for w in self.cfg.workloads}
        rows = []
        for key in (k for k in MEMORY_WORKLOADS if k in chosen):
            for dtype in (DTYPES[d] for d in MEMORY_DTYPES if DTYPES[d] in self.cfg.dtypes):
                case = Case.draw(WORKLOADS[key], dtype, steps, neurons, self.cfg.device).mode(True)
                for system, make in (("ours", ours), ("sj", self.sj.forward)):
                    row: dict[str, Any] = {"workload": WORKLOADS[key].label, "dtype": dtype_name(dtype),
                                           "system": system, "T": steps, "N": neurons}
                    try:
                        row |= _memory_of(case, make(case))
                    except Exception as error:  # noqa: BLE001
                        row["note"] = why(error)
                    rows.append(row)
                    self.record("memory", row)
                del case
        return {"rows": rows}

    def host(self) -> dict[str, Any]:
        """Wall time per call of LIF at T=4, N=4096 (perf_counter over many calls, synchronised at the end).
        Inference runs its calls under one `torch.no_grad()`, as a network's forward runs all its layers: entering
        the context costs about as much host time as two allocations, and it is neither ours nor the peer's."""
        steps, neurons, calls = 4, 4096, (20 if self.cfg.quick else 500)
        data = Case.draw(WORKLOADS["lif"], torch.float32, steps, neurons, self.cfg.device)
        rows = []
        for mode, threads in HOST_CALLS:
            case = data.mode(mode == "training")
            for system, make in (("ours", ours), ("ours, spec by name", lambda c: ours(c, by_name=True)),
                                 ("sj", self.sj.forward)):
                row: dict[str, Any] = {"system": system, "mode": mode, "T": steps, "N": neurons, "calls": calls,
                                       "multithreaded_backward": threads}
                try:
                    fn = call(case, make(case)) if case.training else make(case)
                    with torch.set_grad_enabled(case.training), torch.autograd.set_multithreading_enabled(threads):
                        rounds = self._wall_per_call(fn, calls)
                    row |= {"us_per_call": statistics.median(rounds), "us_per_call_rounds": rounds}
                except Exception as error:  # noqa: BLE001
                    row["note"] = why(error)
                rows.append(row)
                self.record("host", row)
        return {"rows": rows, "what": f"us_per_call: wall time per call, the median of {HOST_ROUNDS} rounds "
                                      "(us_per_call_rounds); inference calls under one torch.no_grad(); "
                                      "multithreaded_backward: False under "
                                      "torch.autograd.set_multithreading_enabled(False)"}

    def _wall_per_call(self, fn: Callable[[], Any], calls: int) -> list[float]:
        """Microseconds per call of each of HOST_ROUNDS rounds of `calls` calls: a host's load moves single
        rounds by more than a tenth."""
        for _ in range(max(3, calls // 10)):
            fn()
        rounds = []
        for _ in range(HOST_ROUNDS):
            self.clock.sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            self.clock.sync()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
        return rounds

    def first_use(self) -> dict[str, Any]:
        """A fresh process: import to first backward done, with empty caches (cold), then again (warm)."""
        # ours-flexsn / sj-flexsn: a LIF core written in Python, new to the process (traced, derived, compiled)
        libs = ["ours", "ours-flexsn"] + (["sj", "sj-flexsn"] if self.sj.functional is not None else [])
        rows = []
        for lib in libs:
            with tempfile.TemporaryDirectory(prefix="autocuda-bench-") as tmp:
                env = child_env(Path(tmp))
                # Python's bytecode as after an install (pip compiles it), so "cold" means empty kernel caches:
                # on machines that keep no bytecode of their packages every process would compile sympy (or
                # SpikingJelly's imports) from source (`child_env`).
                subprocess.run([sys.executable, "-c", BYTECODE, lib], env=env, capture_output=True, timeout=600)
                for cache in ("cold", "warm"):
                    row: dict[str, Any] = {"system": lib, "cache": cache,
                                           "spec": self.cfg.first_use_spec if lib == "ours" else
                                           "lif core" if lib.endswith("flexsn") else "lif"}
                    argv = [sys.executable, "-c", FIRST_USE, str(self.cfg.device), lib, self.cfg.first_use_spec]
                    start = time.perf_counter()
                    try:
                        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
                    except subprocess.TimeoutExpired:
                        proc = subprocess.CompletedProcess(argv, -1, "", "timed out after 300 s")
                    row["process_wall_s"] = time.perf_counter() - start
                    if proc.returncode == 0:
                        row |= json.loads(proc.stdout.strip().splitlines()[-1])
                    else:
                        row["note"] = "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
                    rows.append(row)
                    self.record("first_use", row)
        return {"rows": rows, "what": "first_use_s: from `import autocuda` (torch already imported, CUDA context "
                                      "up) to the first backward done; process_wall_s: the whole process"}


# Imports (without running anything) every module a first use needs, so that their bytecode is cached.
BYTECODE = r"""
import sys
import torch, sympy, jinja2, numpy
if sys.argv[1].startswith("ours"):
    import autocuda.call.functional, autocuda.codegen.kernels, autocuda.runtime.reference
    import autocuda.nn, autocuda.spec.python
else:
    import spikingjelly.activation_based.functional, spikingjelly.activation_based.neuron.flexsn
"""

# The child of the first-use benchmark: it must not import autocuda before the clock starts.
FIRST_USE = r"""
import json, sys, time
start = time.perf_counter()
import torch
device, lib, spec = torch.device(sys.argv[1]), sys.argv[2], sys.argv[3]
x = (torch.randn(4, 4096, device=device) * 2.0 + 0.5).requires_grad_(True)
g = torch.randn(4, 4096, device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
def lif_core(spike):
    def lif(x, v):
        h = v + (x - v) / 2.0
        s = spike(h - 1.0)
        return s, h * (1.0 - s)
    return lif
if lib == "ours":
    from autocuda.call.functional import multi_step
    spikes = multi_step(spec, x)[0]
elif lib == "ours-flexsn":
    from autocuda.nn import FlexSN
    from autocuda.spec.surrogate import Sigmoid
    spikes = FlexSN(lif_core(Sigmoid(4.0)), 1)(x)
elif lib == "sj-flexsn":
    from spikingjelly.activation_based.neuron.flexsn import FlexSN
    from spikingjelly.activation_based.surrogate import sigmoid
    spikes = FlexSN(lif_core(lambda z: sigmoid.apply(z, 4.0)), 1)(x)
else:
    from spikingjelly.activation_based.functional import lif_multi_step
    spikes = lif_multi_step(x, torch.zeros(4096, device=device))[0]
sync()
t1 = time.perf_counter()
(spikes * g).sum().backward()  # a training step's backward (autograd.grad with grad_outputs imports sympy: torch 2.11)
sync()
t2 = time.perf_counter()
print(json.dumps({"first_use_s": t2 - t0, "first_forward_s": t1 - t0, "torch_and_cuda_init_s": t0 - start}))
"""


def child_env(tmp: Path) -> dict[str, str]:
    """The environment of a first-use child: empty caches under `tmp`, bytecode written there (without
    PYTHONDONTWRITEBYTECODE, which would keep the bytecode step from writing anything), this process's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUPY_CACHE_IN_MEMORY", "PYTHONDONTWRITEBYTECODE")}
    env |= {"AUTOCUDA_CACHE_DIR": str(tmp / "autocuda"), "CUPY_CACHE_DIR": str(tmp / "cupy"),
            "PYTHONPYCACHEPREFIX": str(tmp / "bytecode"),
            "TRITON_CACHE_DIR": str(tmp / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the packages this process sees
    return env


def _memory_of(case: Case, forward: Forward) -> dict[str, float]:
    step, device = call(case, forward), case.x.device
    for _ in range(2):
        step()
    torch.cuda.synchronize(device)
    neuron_steps = case.x.numel()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    spikes, finals = forward()
    outputs = sum(t.numel() * t.element_size() for t in (spikes, *finals))
    held = torch.cuda.memory_allocated(device) - base - outputs
    grads = torch.autograd.grad(spikes, case.grad_inputs, case.g, allow_unused=True)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del spikes, finals, grads
    return {"saved_bytes_per_step": held / neuron_steps, "peak_bytes_per_step": peak / neuron_steps}


def _command(*argv: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def environment(device: torch.device, sj: SpikingJelly) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": str(device), "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "autocuda": autocuda.__version__,
        "autocuda_commit": _command("git", "rev-parse", "--short", "HEAD", cwd=Path(autocuda.__file__).parent),
        "nvrtc": nvrtc.version() if nvrtc.found() else None,
        "triton": version("triton"), "spikingjelly": sj.version or sj.missing,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "driver": _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                                   f"--id={device.index or 0}")}
    return env


def why(error: BaseException) -> str:
    """A table note: 'skipped: reason' for a Skip, else 'error: Type: first line'."""
    return f"skipped: {error}" if isinstance(error, Skip) else f"error: {first_line(error)}"


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def progress_line(row: Row) -> str:
    """One measured row, as the log shows it."""
    d = row.derived()
    return (f"{row.workload} {row.dtype} {row.mode} T={row.T} N={count(row.N)}: ours {fmt(row.ours_ms, '.3f')} ms "
            f"({fmt(d['pct_floor'], '.0f')}% of floor), SJ {fmt(row.sj_ms, '.3f')}, compile "
            f"{fmt(row.compile_ms, '.3f')}, eager {fmt(row.eager_ms, '.3f')}; check {row.check}")


def _kept_speed_rows(progress: Path) -> dict[tuple, dict[str, Any]]:
    """The speed rows of a run cut short, by (spec, dtype, mode, T, N); rows cut off mid-line are dropped."""
    kept = {}
    lines = progress.read_text().splitlines() if progress.exists() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.pop("part", None) == "speed":
            kept[(row["spec"], row["dtype"], row["mode"], row["T"], row["N"])] = row
    return kept
