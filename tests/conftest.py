"""Shared test machinery: the test profiles (default and `--slow`), the `gpu` marker's skip rule, nvcc compile
checks, a host C++ evaluator, and the seeds' two worked kernels (heaviside, cumsum) built for any dtype.

torch, numpy, hypothesis and autocuda are imported by the functions that use them: pytest-xdist's controller
loads this file too, runs no test, and would import them (seconds of CPU) before it starts the workers.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest

if TYPE_CHECKING:
    import numpy as np
    import torch

    from autocuda.codegen.ckernel import CKernel1D, CKernel2D

# -- profiles -----------------------------------------------------------------------------------------
# The default profile runs every property and fuzzer with fewer examples, checks a covering set of the kernel
# variants where a test would check all of them (REPRESENTATIVE_SPECS), and does not nvcc-check again a source
# nvcc accepted before (see `nvcc`); the slow profile (`--slow` or AUTOCUDA_SLOW_TESTS=1) runs each with its full
# count and every variant, and checks every source. Tests that set their own count take it from `examples`.
SLOW_VARIABLE = "AUTOCUDA_SLOW_TESTS"
PROFILES = {"default": 20, "slow": 100}  # hypothesis's max_examples where a test sets none


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help=f"full example counts for the property tests and fuzzers, and every kernel variant "
                          f"(as {SLOW_VARIABLE}=1)")


# Test files that call torch.compile (with any backend, Inductor in some profile; or through the benchmark's
# `systems.compiled`) or torch.library.opcheck (which traces with AOTAutograd). A process's first such call pays
# seconds of set-up that later ones reuse (Dynamo's and AOTAutograd's; Inductor's, its C++ toolchain checks and
# headers, more), so with xdist one worker takes all these files, as one unit of work (`schedule_scope`);
# every other file is a unit of its own. tests/test_schedule.py pins the list against the files' calls.
COMPILE_FILES = ("test_batchnorm.py", "test_benchmark.py", "test_builder_arrays.py", "test_compile_after_changes.py",
                 "test_export.py", "test_final_states.py", "test_functional.py", "test_gradient_passes.py",
                 "test_memory_order.py", "test_native_ops.py", "test_nn.py", "test_noise_specs.py", "test_ops.py",
                 "test_recompute.py", "test_reference_compile.py", "test_replay_charge.py",
                 "test_special_neurons_after_construction.py", "test_surrogate_edges.py")
COMPILE_SCOPE = "torch.compile"


def schedule_scope(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: its file, or COMPILE_SCOPE for the COMPILE_FILES."""
    path = nodeid.split("::", 1)[0]
    return COMPILE_SCOPE if path.rsplit("/", 1)[-1] in COMPILE_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's file scheduling (set in pytest_configure) with the units of `schedule_scope`."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndInductorScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule_scope(nodeid)

    return FilesAndInductorScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    controller = getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ
    if controller and config.option.dist in ("no", "load"):
        # Each file runs whole on one worker (its tests share module state and fixtures), the Inductor users all
        # on one (pytest_xdist_make_scheduler), and workers take the files in the order one process runs them. Set
        # here, not in addopts: without xdist (the GPU machine) the options would not parse.
        config.option.dist = "loadfile"
        config.option.loadscopereorder = False
    if config.getoption("--slow"):
        os.environ[SLOW_VARIABLE] = "1"  # seen by the test modules, xdist's workers and subprocesses
    if controller:  # it runs no test: neither profiles nor threads to set
        return
    from hypothesis import settings

    gc.disable()  # until the tests are collected: see pytest_collection_finish
    share_cores()
    for name, count in PROFILES.items():
        settings.register_profile(f"autocuda-{name}", max_examples=count)
    if not config.getoption("hypothesis_profile", None):  # an explicit --hypothesis-profile wins
        settings.load_profile(f"autocuda-{profile()}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test (and the fixtures it sets up first) starts torch's, NumPy's and Python's global generators from a
    seed of its own name: what an unseeded draw gives then depends neither on the tests that ran before it in its
    process nor on which worker runs it, so a failure is the same in every run and when the test runs alone."""
    seed = zlib.crc32(item.nodeid.encode())
    random.seed(seed)
    for name in ("torch", "numpy"):  # seeded where imported already: importing them here would cost the others
        module = sys.modules.get(name)
        if module is not None:
            (module.manual_seed if name == "torch" else module.random.seed)(seed)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collection imports torch, sympy and every test module and builds the test items: objects that live as long
    as the process. The garbage collector's full passes would walk them all each time (seconds over a run), so
    it is off while they are built; after one collection they are frozen out of its passes (gc.freeze)."""
    gc.collect()
    gc.freeze()
    gc.enable()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test file's last test: what its tests made and still hold (torch.compile's and sympy's caches, kept
    kernels, module fixtures) frozen out of the collector's passes too, after one collection of what they left. Each
    full pass walks every object not frozen (seconds over a run), and a process's caches only grow."""
    if nextitem is not None and nextitem.path != item.path:
        gc.collect()
        gc.freeze()


def collect_everything() -> None:
    """A full collection, what earlier files left included (`pytest_runtest_teardown` froze it): for a test that
    counts what is still held (native plans, say) once objects an earlier test may have made are dropped."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def cores() -> int:
    """The cores this test process may keep busy: in an xdist worker its share, else all of them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def share_cores() -> None:
    """In an xdist worker: torch's threads (and those of the scripts the tests start) limited to the worker's share
    of the cores, since workers that each spin a thread per core slow each other down many times over. The
    tests' compiler pools take `cores()` as well: more compilers than cores cost CPU time in switching."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")) > 1:
        threads = cores()
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        torch.set_num_threads(min(torch.get_num_threads(), threads))


def profile() -> str:
    """The profile in force: "slow" where $AUTOCUDA_SLOW_TESTS is set (and not 0), else "default"."""
    return "slow" if os.environ.get(SLOW_VARIABLE, "0").strip() not in ("", "0") else "default"


# Specs that the default profile runs with more options than the others in tests that cover many variants (with
# --slow every spec runs with every option; by default the others run with their own reset and default options):
# test_neuron_compile checks each option combination on one of them, test_host_neurons gives them every explicit
# example and both default-path dtypes. alif has two
# states, one of them replayed in backward, and all three reset rules; parametric_lif a per-neuron tensor
# parameter; nonspiking_if no parameter at all (nothing to hoist), no hard reset and an output that is not the
# spike. With them, rendering test_neuron_compile's default set runs every line and branch of the generator and
# its templates that rendering the full set runs (bench/results/2026-11-27-cpu2-test-time/branches.py).
REPRESENTATIVE_SPECS = ("alif", "parametric_lif", "nonspiking_if")


def examples(full: int, default: int) -> int:
    """A property's example count: `full` in the slow profile, `default` (the fewest that still draw every
    kind of case the property is about) otherwise."""
    return full if profile() == "slow" else min(full, default)


# -- the gpu marker -----------------------------------------------------------------------------------
@functools.cache
def gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    from autocuda.toolchain import nvrtc

    if not nvrtc.found():
        return "needs NVRTC (libnvrtc) to compile kernels: pip install 'autocuda[cuda13]' or a CUDA toolkit"
    return None


GPU_TESTS = Path(__file__).parent / "gpu"  # modules of gpu-marked tests alone


class SkippedGpuModule(pytest.Module):
    """A module of GPU_TESTS where GPU tests cannot run: skipped whole, with the reason, before it is imported (its
    imports and its hundreds of skipped tests would cost each xdist worker seconds)."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        raise pytest.skip.Exception(gpu_missing() or "", allow_module_level=True)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.parent == GPU_TESTS and gpu_missing():
        return SkippedGpuModule.from_parent(parent, path=module_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport | None:
    """A SkippedGpuModule's report: skipped, at the module's path, with the reason."""
    if not isinstance(collector, SkippedGpuModule):
        return None
    return pytest.CollectReport(collector.nodeid, "skipped", (str(collector.path), 1, f"Skipped: {gpu_missing()}"),
                                [])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """gpu-marked tests outside GPU_TESTS skip one by one, with the reason, where GPU tests cannot run."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = gpu_missing() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


# -- child processes that import autocuda.toolchain.host alone ---------------------------------------------------------
# What the host runner reads of autocuda.ckernel.CParam, as a script's text: a child process that runs kernels
# through autocuda.toolchain.host without importing autocuda.ckernel (whose module imports torch: seconds a process)
# defines it with this (the scripts of tests/test_host.py and tests/test_reliability.py).
HOST_PARAM_CLASS = """
@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    ctype: str
    pointer: bool
    const: bool

    def declaration(self, restrict=False, cname=""):
        const, star = "const " if self.const else "", "* " if self.pointer else " "
        return const + self.ctype + star + (cname or self.name)
"""


# -- nvcc -----------------------------------------------------------------------------------------------
# A source nvcc accepted is recorded (by a digest of nvcc's identity, the architectures and the source) in
# pytest's cache folder, and not compiled again in the default profile: the same compiler given the same text
# gives the same verdict. Failures are never recorded; the slow profile and `--cache-clear` compile everything.
@functools.cache
def nvcc_identity() -> str:
    from autocuda.toolchain.compile import nvcc_path

    path = nvcc_path()
    return path + "\n" + subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout


def compile_batch(sources: Mapping[str, str], archs: Sequence[str] | None = None,
                  passed: Path | None = None, assemble: bool | None = None) -> dict[str, str]:
    """nvcc-check each labelled source (in parallel, without optimisation: see `nvcc_check`) for `archs` (default
    CHECK_ARCHS), to SASS where `assemble`, to PTX where it is False; by default (None) to SASS for every
    architecture with --slow, for the first alone otherwise, the others stopping at PTX: ptxas assembling another
    architecture's PTX of the same source adds no verdict on the generator's code, while the front end and cicc,
    which decide the CUDA headers' paths under __CUDA_ARCH__, run for each (tests/test_neuron_compile.py's module
    doc). The failures as label -> nvcc's message. Sources recorded in the folder `passed` are taken as accepted;
    those accepted now are recorded there."""
    from autocuda.toolchain.compile import CHECK_ARCHS, CompileError, nvcc_check

    archs = CHECK_ARCHS if archs is None else archs
    assembled = (True if profile() == "slow" else tuple(archs[:1])) if assemble is None else assemble

    def check(item: tuple[str, str]) -> tuple[str, str | None]:
        key = f"{nvcc_identity()}\n{archs}\nunoptimised, assembled: {assembled}\n{item[1]}"
        record = passed and passed / hashlib.sha256(key.encode()).hexdigest()
        if record and record.is_file():
            return item[0], None
        try:
            nvcc_check(item[1], archs, optimise=False, assemble=assembled)
        except CompileError as error:
            return item[0], str(error)
        if record:
            record.touch()
        return item[0], None

    with ThreadPoolExecutor(max_workers=cores()) as pool:
        results = list(pool.map(check, sources.items()))
    return {label: message for label, message in results if message is not None}


def first_arch_by_default() -> tuple[str, ...] | None:
    """The architectures for a check whose point is not the architecture (a printed expression, a command's output, a
    spec's draws): None (CHECK_ARCHS, every one) with --slow, the first alone by default. The front end decides
    per architecture only the CUDA headers' paths under __CUDA_ARCH__ (cuda_bf16's native arithmetic on sm_90, say),
    and tests/test_neuron_compile.py checks those for every dtype and kernel option on every architecture."""
    from autocuda.toolchain.compile import CHECK_ARCHS

    return None if profile() == "slow" else tuple(CHECK_ARCHS[:1])


def compile_together(check: Callable[..., dict[str, str]], sources: Mapping[str, str], **options: object
                     ) -> dict[str, str]:
    """`check` (the `nvcc` fixture) on the labelled sources joined into one translation unit: one nvcc run, not
    one per source (each run pays nvcc's start-up and the CUDA headers again). Where nvcc refuses the unit, each
    source on its own, so that the failures name their sources. Each source must stand alone and declare its own
    kernel names (generated ones do: their shared preludes sit behind include guards)."""
    if len(sources) > 1 and not check({" + ".join(sources): "\n".join(sources.values())}, **options):
        return {}
    return check(dict(sources), **options)


@pytest.fixture(scope="session")
def nvcc(request: pytest.FixtureRequest) -> Callable[..., dict[str, str]]:
    """`compile_batch` (with the record of accepted sources, in the default profile where pytest's cache is
    on), or a skip (with the reason) where the CUDA toolkit is absent."""
    from autocuda.toolchain.compile import nvcc_path

    try:
        nvcc_path()
    except RuntimeError as error:
        pytest.skip(str(error))
    cache = getattr(request.config, "cache", None)
    if cache is None or profile() == "slow":
        return compile_batch
    return functools.partial(compile_batch, passed=cache.mkdir("autocuda-nvcc-accepted"))


# -- host kernels compiled ahead -------------------------------------------------------------------------------
# Most kernels in one compiler run of kernels compiled up front. Each run pays a fixed cost (the compiler's start,
# the shim's precompiled header, the link) beside the kernels' own, so a fixture's
# kernels compile in as few runs as keep this process's cores busy (`host_group`), not in load_kernels' default
# groups; a run of this many takes a few hundred MB.
HOST_UNIT = 256


def host_group(count: int) -> int:
    """Kernels per compiler run for `count` kernels compiled up front: one run per core of this process (`cores`),
    or more where that would put more than HOST_UNIT kernels in a run."""
    runs = max(cores(), math.ceil(count / HOST_UNIT))
    return max(1, math.ceil(count / runs))


def compile_checked(*calls: Callable[[], object]) -> int:
    """Compile the host kernels that `calls` of `autocuda.tools.testing.check_spec` compile up front (each call
    compiles its cases' kernels in a compiler run of its own, before it runs a case) together, many to a compiler run
    (`host_group`) and a run per core of this process; the number of kernels. Each call is stopped where it would
    compile, and runs whole when its test calls it. For a module fixture of tests that each call check_spec."""
    import autocuda.toolchain.host
    from autocuda.toolchain.host import cxx

    if cxx.missing() is not None:  # no host compiler: the tests that launch skip themselves
        return 0
    jobs: dict[str, tuple] = {}

    class Recorded(Exception):
        """A call's kernels are recorded: it is stopped."""

    def record(found: Iterable[tuple], *args: object, **kwargs: object) -> list:
        jobs.update((job[1], tuple(job)) for job in found)
        raise Recorded

    load = autocuda.toolchain.host.load_kernels
    autocuda.toolchain.host.load_kernels = record
    try:
        for call in calls:
            try:
                call()
            except Recorded:
                pass
    finally:
        autocuda.toolchain.host.load_kernels = load
    load(jobs.values(), group=host_group(len(jobs)), workers=cores())
    return len(jobs)


def compile_launched(*calls: Callable[[], object]) -> int:
    """Compile the host kernels that `calls` launch through the Python launch path up front, many to a compiler run
    (`host_group`) and a run per core of this process (`autocuda.toolchain.host.load_kernels`, `cores`); the number
    of kernels. The calls run with each host launch recorded instead of run: their outputs are left unwritten, so a
    call that fails on what it reads is stopped there, and a kernel it did not reach compiles when the test launches
    it. For a module fixture: the tests would compile each kernel in a compiler run of its own. (The native call path
    loads its own.) The calls leave the global generator as it was; without a host compiler nothing compiles (0)."""
    import torch

    import autocuda.toolchain.host
    from autocuda.toolchain.host import cxx

    if cxx.missing() is not None:  # no host compiler: the tests that launch skip themselves
        return 0
    jobs: dict[str, tuple] = {}

    def record(source: str, name: str, params: Sequence, *args: object, **kwargs: object) -> None:
        jobs[name] = (source, name, tuple(params))

    launch = autocuda.toolchain.host.launch
    autocuda.toolchain.host.launch = record
    try:
        with torch.random.fork_rng():  # the calls' draws from the global generator leave it as it was
            for call in calls:
                try:
                    call()
                except Exception:  # noqa: BLE001 - unwritten outputs may fail a call; its test runs it for real
                    pass
    finally:
        autocuda.toolchain.host.launch = launch
    autocuda.toolchain.host.load_kernels(jobs.values(), group=host_group(len(jobs)), workers=cores())
    return len(jobs)


# -- torch's deterministic algorithms ---------------------------------------------------------------------------
@contextlib.contextmanager
def deterministic_algorithms(on: bool = True) -> Iterator[None]:
    """torch.use_deterministic_algorithms(on) within the block, then as it was."""
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


# -- the native call path -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def native_library() -> None:
    """The native call path's library, loaded (built first where the cache lacks it: tens of seconds of one core),
    or a skip with the reason. Only the tests that ask for it build it: the path is for CUDA calls, and host calls
    take it only where `native.HOST` says so."""
    from autocuda.call import native

    if not native.ensure():
        pytest.skip(f"no native call path here: {native.status()}")


@pytest.fixture
def native_on_host(native_library: None, monkeypatch: pytest.MonkeyPatch):
    """Host calls through the native path for the test (`native.USE` and `native.HOST` on); the functional calls'
    programs made before it, and those it made, are forgotten (a host program decides its path when it binds)."""
    from autocuda.call import native, program

    monkeypatch.setattr(native, "USE", True)
    monkeypatch.setattr(native, "HOST", True)
    program.PROGRAMS.clear()
    yield
    program.PROGRAMS.clear()


@pytest.fixture
def keyed_results(monkeypatch: pytest.MonkeyPatch) -> list[list]:
    """The results of each keyed call of a layer (`Program.run_layer`; [] where the layer's full path then runs the
    call), in order, appended as they come."""
    from autocuda.call import program

    seen: list[list] = []
    original = program.Program.run_layer

    def spy(self, x, states, numbers, params=()):
        results = original(self, x, states, numbers, params)
        seen.append(results)
        return results

    monkeypatch.setattr(program.Program, "run_layer", spy)
    return seen


# -- host evaluation of C expressions ---------------------------------------------------------------------
class HostCase(NamedTuple):
    """A statement computing `r` (of C type `ctype`) from the variables `names`, evaluated at each point."""

    ctype: str
    statement: str
    names: Sequence[str]
    points: Sequence[Sequence[float]]


def _c_double(value: float) -> str:
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return repr(float(value))


def host_program(cases: Sequence[HostCase]) -> str:
    from autocuda.codegen.dtypes import NAN_FOLDS

    cases = [HostCase(*case) for case in cases]
    # the printed min and max call helpers (`NAN_FOLDS`) that kernels declare for the device
    lines = ["#include <cmath>", "#include <math.h>", "#include <cstdio>", "#define __device__",
             "#define __forceinline__ inline", NAN_FOLDS]
    for i, case in enumerate(cases):
        lines.append(f"static double case{i}(const double* v) {{")
        lines += [f"    const {case.ctype} {n} = ({case.ctype})v[{j}];" for j, n in enumerate(case.names)]
        lines += [f"    {case.ctype} r;", f"    {case.statement}", "    return (double)r;", "}"]
    lines.append("int main() {")
    for i, case in enumerate(cases):
        for point in case.points:
            values = ", ".join(_c_double(v) for v in point) or "0.0"
            lines.append(f'    {{ const double v[] = {{{values}}}; std::printf("%.17g\\n", case{i}(v)); }}')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def run_host(cases: Sequence[HostCase]) -> list[np.ndarray]:
    """Compile all cases (HostCase or plain tuples) into ONE C++ program with g++ and run it.

    Returns each case's values at its points, in order.
    """
    import numpy as np

    cases = [HostCase(*case) for case in cases]
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a host C++ compiler (g++) to evaluate emitted C")
    source = host_program(cases)
    with tempfile.TemporaryDirectory(prefix="autocuda-host-") as tmp:
        src, exe = Path(tmp) / "eval.cpp", Path(tmp) / "eval"
        src.write_text(source)
        built = subprocess.run([compiler, "-std=c++17", "-O0", "-o", str(exe), str(src)],
                               capture_output=True, text=True)
        assert built.returncode == 0, f"g++ rejected the emitted C:\n{built.stderr}\n{source}"
        ran = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    values = iter(float(v) for v in ran.stdout.split())
    return [np.array([next(values) for _ in case.points]) for case in cases]


@pytest.fixture(scope="session")
def host_eval() -> Callable[[Sequence[HostCase]], list[np.ndarray]]:
    return run_host


# -- the seeds' worked examples -----------------------------------------------------------------------------
def heaviside_kernel(dtype: str | torch.dtype) -> CKernel1D:
    """y = Θ(x) element-wise (Θ(0) = 1), in the word type of `dtype`."""
    from autocuda.codegen import cfunction
    from autocuda.codegen.ckernel import CKernel1D
    from autocuda.codegen.dtypes import get_dtype

    d = get_dtype(dtype)
    kernel = CKernel1D(kernel_name=f"heaviside_{d.name}")
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"{d.ctype} *", "y")
    kernel.core = cfunction.heaviside("y[index]", "x[index]", dtype=d)
    return kernel


def cumsum_kernel(dtype: str | torch.dtype, reverse: bool = False) -> CKernel2D:
    """y[t] = x[t] + y[t -/+ 1] over the time axis of [T, N]; `reverse` sums from the last step back."""
    from autocuda.codegen import cfunction
    from autocuda.codegen.ckernel import CKernel2D
    from autocuda.codegen.dtypes import get_dtype

    d = get_dtype(dtype)
    kernel = CKernel2D(kernel_name=f"cumsum_{d.name}{'_rev' if reverse else ''}", reverse=reverse)
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"{d.ctype} *", "y")
    first, previous = ("t + dt >= numel", "y[t + dt]") if reverse else ("t - dt < 0", "y[t - dt]")
    kernel.core = f"""
        if ({first}) {{
            y[t] = x[t];
        }} else {{
            {cfunction.add("y[t]", "x[t]", previous, dtype=d)}
        }}
    """
    return kernel


@pytest.fixture(scope="session")
def seed_kernels() -> Mapping[str, Callable[..., CKernel1D | CKernel2D]]:
    """{'heaviside': dtype -> CKernel1D, 'cumsum': (dtype, reverse=False) -> CKernel2D}."""
    return {"heaviside": heaviside_kernel, "cumsum": cumsum_kernel}
