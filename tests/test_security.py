"""The attack suite of specs: every way found to hang the process, exhaust its memory, crash it, or get a raw
Python error out of a spec, each as a test; a fuzzer over generated specs; parameter domains.

The cache's trust model is tested in test_security_cache.py, user names in generated C in test_security_names.py.
Hangs are guarded by running each attack under a small symbolic budget and a wall-clock ceiling far above it:
a regression shows up as a failure, not as a suite that never ends.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import compile_launched, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autocuda import nn as ann
from autocuda.base.errors import ConstantRangeError, SpecError
from autocuda.call import functional as F
from autocuda.codegen import kernels
from autocuda.spec import budget
from autocuda.spec.domain import parse_domain
from autocuda.spec.load import load_spec, spec_from_toml
from autocuda.spec.model import NeuronSpec, Param
from autocuda.spec.surrogate import Custom
from autocuda.tools.testing import check_spec

CEILING = 30.0  # seconds of the process's CPU time (load does not count): far above the attacks' budget, far
#                 below "hangs"; also the wall-clock bound of joins that wait for a hang to end
LIF_PARAMS = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory) -> Path:
    """The file's own disk cache, apart from the run's: shared by its tests, so that the host runner's precompiled
    shim and kernels are built once, not per test. No test reads another's entries as an attack's answer: a
    refused spec is never stored."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def small_budget(monkeypatch, private_cache):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "2")
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(private_cache))


def lif(charge: str = "v + (x - v) / tau", **fields) -> NeuronSpec:
    return NeuronSpec(name="attack", params=fields.pop("params", LIF_PARAMS), states=fields.pop("states", {"v": 0.0}),
                      charge=charge, **fields)


def derived_everything(spec: NeuronSpec) -> None:
    """Every symbolic stage a spec goes through before compiling: parse, step, derivation, rendering."""
    kernels.source(spec, "fptt")
    kernels.source(spec, "bptt")


def refused_in_time(make, field: str | None = None) -> SpecError:
    start = time.process_time()
    with pytest.raises(SpecError) as caught:
        derived_everything(make())
    assert time.process_time() - start < CEILING
    if field is not None:
        assert caught.value.field == field, caught.value
    return caught.value


# -- 2. specs that made sympy evaluate without end ------------------------------------------------------------------
def chain_of_squares(depth: int) -> list[tuple[str, str]]:
    return [("d0", "2"), *((f"d{i}", f"d{i - 1} * d{i - 1}") for i in range(1, depth))]


EXPLOSIVE = {
    "symbolic base, huge exponent": lambda: lif("(2*v)**(10**29) + x"),
    "root of two, huge exponent": lambda: lif("v + sqrt(2)**(10**29) + x"),
    "exp of a huge multiple of a log": lambda: lif("v + exp(10**29*log(2)) + x"),
    "derived value to a huge power": lambda: lif(
        "v + x * b", params={**LIF_PARAMS, "a": 2.0}, derived={"c": "a + 1", "b": "c**(10**29)"}),
    "chain of derived squares": lambda: lif("v + x * d39", derived=dict(chain_of_squares(40))),
    "parameter to a huge power": lambda: lif("v + x * (2*tau)**(10**12)"),
    "ode with a huge power": lambda: NeuronSpec(
        name="attack", params=LIF_PARAMS, states={"v": 0.0}, ode={"v": "-v / (tau + 1)**100000000 + x"}),
    "learnable parameter in a high power": lambda: lif(
        "(v*tau + 1)**1000 + x", params={**LIF_PARAMS, "tau": {"default": 2.0, "learnable": True}}),
    "nested powers": lambda: lif("v + x * (((tau**64)**64)**64)**64"),
}


@pytest.mark.parametrize("attack", EXPLOSIVE)
def test_explosive_powers_are_refused_in_time(attack):
    error = refused_in_time(EXPLOSIVE[attack])
    assert error.field, error


def test_a_custom_surrogate_gradient_cannot_explode():
    start = time.process_time()
    with pytest.raises(SpecError) as caught:
        Custom("(2*x)**(10**29)")
    assert time.process_time() - start < CEILING
    assert caught.value.field == "surrogate.gradient"


def test_chains_that_stay_small_are_accepted():
    # the limits refuse size, not structure: a short chain of derived squares is an ordinary spec
    spec = lif("v + x * d3 / 256", derived=dict(chain_of_squares(4)))
    derived_everything(spec)


# -- the CPU-time budget ----------------------------------------------------------------------------------------------
def three_state_cascade(**fields) -> NeuronSpec:
    return NeuronSpec(name="cascade", params={**LIF_PARAMS, "tau1": 3.0, "tau2": 5.0},
                      states={"v": 0.0, "i1": 0.0, "i2": 0.0},
                      ode={"v": "-v / tau + i2", "i2": "-i2 / tau2 + i1", "i1": "-i1 / tau1 + x"}, **fields)


def test_symbolic_work_past_the_budget_is_refused_naming_the_field(monkeypatch):
    three_state_cascade()  # the exact solution of three triangular states: well within the default budget
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.01")
    with pytest.raises(SpecError, match="budget of 0.01 s") as caught:  # new symbols: nothing in sympy's cache
        NeuronSpec(name="slow", params={**LIF_PARAMS, "r1": 3.0, "r2": 5.0}, states={"v": 0.0, "j1": 0.0, "j2": 0.0},
                   ode={"v": "-v / tau + j2", "j2": "-j2 / r2 + j1", "j1": "-j1 / r1 + x"})
    assert caught.value.field in ("ode", "method"), caught.value


def test_a_budget_never_interrupts_the_caller(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.001")
    refused = 0
    # stages ending before, about at, and after their budget: 20 rounds by default, 40 with --slow
    for size in [2_000, 200_000, 2_000_000] * examples(40, 20):
        try:
            budget.bounded("<test>", "charge", _spin, size)
        except SpecError:
            refused += 1
    time.sleep(0.3)  # an interruption meant for a stage's worker would land in this thread by now
    assert sum(range(1000)) == 499500
    assert 0 < refused


def _spin(steps: int) -> int:
    total = 0
    for step in range(steps):
        total += step
    return total


def _endless() -> None:
    """Work without end: a stage that uses its CPU."""
    while True:
        _spin(1000)


def test_an_abandoned_stage_is_stopped(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.05")
    seen = []

    def endless() -> None:
        seen.append(threading.current_thread())
        _endless()

    with pytest.raises(SpecError, match="budget of 0.05 s of CPU time"):
        budget.bounded("<test>", "charge", endless)
    seen[0].join(CEILING)
    assert not seen[0].is_alive()


def test_an_interruption_that_lands_in_a_finaliser_is_dropped_silently(monkeypatch):
    """Python cannot raise an exception from a finaliser: it hands it to sys.unraisablehook, whose default prints
    "Exception ignored in ..." on stderr. An interruption landing there is dropped without a word, and the next
    one ends the stage."""
    import weakref

    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.05")
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    seen = []

    def finalised_while_interrupted() -> None:
        seen.append(threading.current_thread())
        holder = type("Holder", (), {})()
        weakref.finalize(holder, _spin_for, 0.5)  # runs at the `del`, in this thread, past the budget
        del holder
        _endless()

    with pytest.raises(SpecError, match="budget of 0.05 s of CPU time"):
        budget.bounded("<test>", "charge", finalised_while_interrupted)
    seen[0].join(CEILING)
    assert not seen[0].is_alive()
    assert not reported, [str(r.exc_value) or r.exc_type for r in reported]


def _spin_for(seconds: float) -> None:
    """CPU work for `seconds` of this thread's time, one bytecode after another (an interruption can land)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        _spin(1000)


def test_stages_in_threads_have_their_own_budgets(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.2")
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            budget.bounded("<thread>", "charge", _endless)
        except SpecError as error:
            errors.append(error)

    worker = threading.Thread(target=slow)
    worker.start()
    assert budget.bounded("<main>", "charge", lambda: time.sleep(0.01) or 7) == 7  # in time, not interrupted
    worker.join(CEILING)
    assert len(errors) == 1 and errors[0].source == "<thread>"


def test_errors_of_a_stage_reach_the_caller_unchanged():
    with pytest.raises(KeyError, match="inside"):
        budget.bounded("<test>", "charge", lambda: {}["inside"])
    with pytest.raises(SpecError, match="nested too deeply") as caught:
        budget.bounded("<test>", "threshold", lambda: _recurse(0))
    assert caught.value.field == "threshold"


def _recurse(depth: int) -> int:
    return _recurse(depth + 1) + 1


def _cpu_work(seconds: float) -> str:
    """A stage that uses `seconds` of its thread's CPU time, however long that takes on the wall clock."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        _spin(1000)
    return "done"


def test_a_stage_waiting_for_a_core_is_judged_by_its_work(monkeypatch):
    # A loaded machine runs a stage later, not with more work: here the stage is off its core (asleep) for ten
    # times its budget, as on a machine ten times busier, and loads all the same
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.05")
    assert budget.bounded("<test>", "charge", lambda: time.sleep(0.5) or _cpu_work(0.01)) == "done"


def test_the_verdict_does_not_change_under_load(monkeypatch):
    # the same work under a budget of 0.1 s of CPU, alone and beside two threads that keep the interpreter busy
    # (the stage then gets about a third of it: 0.05 s of CPU takes about 0.15 s of wall-clock time)
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.1")
    verdicts = [_verdict(0.05), _verdict(0.3)]
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            _spin(1000)

    hogs = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for hog in hogs:
        hog.start()
    try:
        loaded = [_verdict(0.05), _verdict(0.3)]
    finally:
        stop.set()
        for hog in hogs:
            hog.join(CEILING)
    assert verdicts == loaded == ["done", "refused"]


def _verdict(cpu_seconds: float) -> str:
    try:
        return budget.bounded("<test>", "charge", _cpu_work, cpu_seconds)
    except SpecError as error:
        assert "budget of 0.1 s of CPU time" in error.message, error
        return "refused"


def test_a_stage_that_waits_without_end_meets_the_backstop(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.05")
    monkeypatch.setattr(budget, "BACKSTOP_SECONDS", 0.3)
    release = threading.Event()
    try:
        with pytest.raises(SpecError, match="within 0.5 s of wall-clock time") as caught:
            budget.bounded("<test>", "ode", release.wait)  # waits, using no CPU
    finally:
        release.set()
    assert caught.value.field == "ode"
    assert budget.backstop_seconds(0.05) == 0.5  # BACKSTOP_FACTOR times the budget, past BACKSTOP_SECONDS


def test_the_budget_is_cpu_time_where_the_platform_has_a_thread_clock():
    if not hasattr(time, "pthread_getcpuclockid"):
        pytest.skip("no CPU clock per thread on this platform: the budget is wall-clock time")
    assert budget._cpu_clock_of_this_thread() is not None


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_the_budget_setting_is_checked(monkeypatch, text):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, text)
    with pytest.raises(ValueError, match=budget.BUDGET_VARIABLE):
        budget.budget_seconds()


# -- 3. the exact ODE method -------------------------------------------------------------------------------------------
def cascade(states: int) -> NeuronSpec:
    names = [f"u{i}" for i in range(states)]
    ode = {names[0]: "-u0 / tau + x"} | {names[i]: f"-{names[i]} / tau{i} + {names[i - 1]}" for i in range(1, states)}
    params = {**LIF_PARAMS, **{f"tau{i}": 2.0 + i for i in range(1, states)}}
    return NeuronSpec(name="cascade", params=params, states=dict.fromkeys(names, 0.0), ode=ode)


@pytest.mark.parametrize("states", [5, 6, 7, 8])
def test_long_linear_cascades_are_fast(states):
    start = time.process_time()
    spec = cascade(states)
    derived_everything(spec)
    assert time.process_time() - start < CEILING
    assert spec.parsed().method == "exponential_euler"  # chosen: no closed form of bounded size


def test_exact_on_coupled_states_falls_back_with_a_note():
    ode = {"v": "-v / tau + 0.1 * w - 0.2 * u + x", "w": "-w + 0.1 * v + 0.2 * u", "u": "-u / tau + 0.2 * v - 0.1 * w"}
    start = time.process_time()
    with pytest.warns(UserWarning, match="exponential_euler instead"):
        spec = NeuronSpec(name="coupled", params=LIF_PARAMS, states={"v": 0.0, "w": 0.0, "u": 0.0}, ode=ode,
                          method="exact")
        derived_everything(spec)
    assert time.process_time() - start < CEILING
    assert spec.parsed().method == "exponential_euler"


def test_three_triangular_states_keep_the_exact_solution():
    spec = three_state_cascade()
    assert spec.parsed().method == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        uncoupled = NeuronSpec(name="uncoupled", params={**LIF_PARAMS, "t1": 3.0, "t2": 4.0, "t3": 5.0},
                               states={"v": 0.0, "a": 0.0, "b": 0.0, "c": 0.0}, method="exact",
                               ode={"v": "-v / tau + x", "a": "-a / t1 + x", "b": "-b / t2", "c": "-c / t3 + 1"})
    assert uncoupled.parsed().method == "exact"  # four uncoupled states: each its own exponential


@pytest.mark.parametrize("make", [lambda: cascade(6), three_state_cascade], ids=["fallback", "exact"])
def test_integrated_cascades_match_their_reference(make):
    check_spec(make(), "host", dtypes=("float64",), detach=(False,), examples=2, raise_on_failure=True)


# -- 4. a tensor without CPU storage on the host runner ----------------------------------------------------------------
def in_a_fork(work: Callable[[], str], timeout: float = 300.0) -> tuple[int, str]:
    """`work` run in a fork of this process: its exit code (minus the signal's number where a signal ended it) and
    the text it returned or its traceback. A crash ends the fork, not the test run; the fork has torch and autocuda
    imported already (a new interpreter would import them again: seconds of CPU)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: never returns into pytest
        code, text = 1, ""
        try:
            text, code = work(), 0
        except BaseException:  # noqa: BLE001 - reported to the parent
            text = traceback.format_exc()
        finally:
            os.write(write, text.encode()[:60_000])  # (within a pipe's buffer: written before anyone reads)
            os._exit(code)
    os.close(write)
    deadline = time.monotonic() + timeout
    while not (ended := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
            pytest.fail(f"the fork ran past {timeout} s")
        time.sleep(0.01)
    with os.fdopen(read) as pipe:
        return os.waitstatus_to_exitcode(ended[1]), pipe.read()


def _run_on_meta() -> str:
    try:
        F.multi_step("lif", torch.randn(4, 3, device="meta"), backend="host")
    except ValueError as error:
        return f"refused: {error}"
    return "ran"


def test_meta_tensors_on_the_host_runner_are_refused_not_a_crash():
    code, out = in_a_fork(_run_on_meta)
    assert code == 0, out
    assert out.startswith("refused:") and "meta" in out, out


def test_a_crash_in_the_fork_is_its_exit_code():
    code, _ = in_a_fork(lambda: os.kill(os.getpid(), signal.SIGSEGV) or "")
    assert code == -signal.SIGSEGV
    assert in_a_fork(lambda: {}["missing"])[0] == 1


# -- 6. a spec file edited between two calls ---------------------------------------------------------------------------
SPEC_FILE = """params = {{ tau = 2.0, v_threshold = 1.0, v_reset = 0.0 }}
states = {{ v = 0.0 }}
charge = "{charge}"
"""


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_an_edited_spec_file_is_read_again(tmp_path, backend):
    path = tmp_path / "my_neuron.toml"
    x = torch.full((3, 2), 0.6, dtype=torch.float64)
    path.write_text(SPEC_FILE.format(charge="v + x"))
    first = F.multi_step(str(path), x, backend=backend)[0]
    path.write_text(SPEC_FILE.format(charge="v + 2.0 * x"))
    second = F.multi_step(str(path), x, backend=backend)[0]
    assert first.tolist() == [[0, 0], [1, 1], [0, 0]]
    assert second.tolist() == [[1, 1]] * 3
    assert load_spec(path).charge == "v + 2.0 * x"


def test_a_spec_path_that_is_not_a_small_regular_file_is_refused(tmp_path):
    """A FIFO blocked the load for good, a link to /dev/zero filled memory: the file is opened without blocking,
    checked on its descriptor and read to at most MAX_SPEC_BYTES + 1 bytes."""
    from autocuda.spec.load import MAX_SPEC_BYTES

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    loader = threading.Thread(target=lambda: result.append(pytest.raises(SpecError, load_spec, fifo).value),
                              daemon=True)
    loader.start()
    loader.join(CEILING)
    if loader.is_alive():  # blocked in open(): a writer's open releases it, and the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        loader.join(CEILING)
        pytest.fail("loading a FIFO blocked")
    assert str(result[0]) == f"{fifo}: not a regular file (a FIFO): a spec is read from a regular file"
    device = tmp_path / "device.toml"
    device.symlink_to(os.devnull)  # /dev/zero was read without end; /dev/null, empty, was read as a spec
    with pytest.raises(SpecError, match=r"device\.toml: not a regular file \(a device\)"):
        load_spec(device)
    (tmp_path / "folder.toml").mkdir()
    with pytest.raises(SpecError, match=r"folder\.toml: not a regular file \(a directory\)"):
        load_spec(tmp_path / "folder.toml")
    big, text = tmp_path / "big.toml", SPEC_FILE.format(charge="v + x") + "#"
    big.write_text(text + " " * (MAX_SPEC_BYTES + 1 - len(text)))
    with pytest.raises(SpecError, match=rf"big\.toml: larger than {MAX_SPEC_BYTES} bytes, the limit of a spec file"):
        load_spec(big)
    big.write_text(text + " " * (MAX_SPEC_BYTES - len(text)))  # the limit itself is accepted
    assert load_spec(big).charge == "v + x"


# -- 7. raw Python errors ----------------------------------------------------------------------------------------------
def nested(function: str, depth: int, inner: str = "v") -> str:
    for _ in range(depth):
        inner = f"{function}({inner})"
    return inner


RAW = {
    "product of large literals": lambda: lif("1e30*v*1e30*1e30 + x"),
    "constants folded out of range": lambda: lif(
        "v + c * c * x", params={**LIF_PARAMS, "c": {"default": 1e30, "kind": "constant"}}),
}


@pytest.mark.parametrize("attack", RAW)
def test_raw_errors_are_spec_errors(attack):
    error = refused_in_time(RAW[attack])
    assert error.field and error.source == "<python>"


def test_deep_nesting_is_refused_or_derived_in_time(monkeypatch):
    """How deep sympy recurses on a 30-deep nesting depends on what its caches hold from earlier work in the
    process, so the derivation may finish or run out of stack: either is fine, in time, and running out is a
    SpecError naming the field (never a RecursionError or a crash)."""
    monkeypatch.setenv(budget.BUDGET_VARIABLE, str(budget.DEFAULT_SECONDS))  # a legitimate spec: the stack is tested
    start = time.process_time()
    try:
        derived_everything(lif(nested("sigmoid", 30) + " + x"))
    except SpecError as error:
        assert error.field == "charge" and "nested too deeply" in error.message, error
    assert time.process_time() - start < CEILING


def test_deeply_nested_toml_is_a_spec_error():
    with pytest.raises(SpecError, match="nested too deeply"):
        spec_from_toml("a = " + "[" * 5000 + "]" * 5000)


# -- 10. parameter domains ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, bound", [(lambda: ann.LIFNode(tau=-1.0), "tau: must be > 1"),
                                         (lambda: ann.Neuron("lif", tau=0.0), "must be > 0"),
                                         (lambda: ann.Neuron("eif", delta_T=0.0), "must be > 0")],
                         ids=["LIFNode (SpikingJelly's tau > 1)", "Neuron", "EIF"])
def test_modules_refuse_numbers_outside_a_domain(make, bound):
    with pytest.raises(ValueError, match=bound):
        make()


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_calls_refuse_numbers_outside_a_domain(backend):
    x = torch.rand(3, 2)
    with pytest.raises(ValueError, match="parameter 'tau' of 'lif' must be > 0, got -2"):
        F.multi_step("lif", x, tau=-2.0, backend=backend)
    with pytest.raises(ValueError, match="must be > 0"):
        F.single_step("lif", x[0], tau=0.0, backend=backend)
    F.multi_step("lif", x, tau=0.5, backend=backend)  # inside: runs


def test_a_module_whose_number_is_changed_later_is_checked_at_the_call():
    layer = ann.LIFNode(tau=2.0, step_mode="m", backend="reference")
    layer.tau = -1.0
    with pytest.raises(ValueError, match="must be > 0"):
        layer(torch.rand(3, 2))


def test_tensors_are_not_checked_and_compute_what_the_equations_give():
    # documented: a check would read the tensor back from the GPU on every call
    spikes = F.multi_step("lif", torch.rand(3, 2), tau=torch.tensor(0.0), backend="reference")[0]
    assert spikes.shape == (3, 2)


@pytest.mark.parametrize("text, bounds", [("> 0", [(">", 0.0)]), (">= 1, <= 100", [(">=", 1.0), ("<=", 100.0)]),
                                          ("< -0.5", [("<", -0.5)]), ("", [])])
def test_domains_parse(text, bounds):
    assert [tuple(b) for b in parse_domain(text)] == bounds


@pytest.mark.parametrize("domain", ["> zero", "== 1", "> 0, > 1", "> 1e999", "tau > 0", 3, "> 0;" * 20])
def test_bad_domains_are_spec_errors_naming_the_field(domain):
    with pytest.raises(SpecError) as caught:
        lif(params={**LIF_PARAMS, "tau": {"default": 2.0, "domain": domain}})
    assert caught.value.field == "params.tau.domain"


def test_a_default_outside_its_domain_is_refused():
    with pytest.raises(SpecError, match="must be >= 1") as caught:
        Param("tau", 0.5, domain=">= 1")
    assert caught.value.field == "params.tau.default"


def test_shipped_time_constants_have_domains():
    for name in ("lif", "izhikevich", "eif", "adex", "alif", "cuba_lif"):
        spec = load_spec(name)
        assert next(p for p in spec.params if p.name == "tau").domain == "> 0", name


# -- the fuzzer --------------------------------------------------------------------------------------------------------
# By default a smoke run: enough specs that every branch of the generator is drawn (the fuzzing test checks it:
# `DRAWN`); the long run (10,000 specs) under --slow, or any count from AUTOCUDA_FUZZ_EXAMPLES.
FUZZ_EXAMPLES = int(os.environ.get("AUTOCUDA_FUZZ_EXAMPLES", examples(10000, 250)))
# Valid tokens are listed several times so that most generated specs get through to the derivation; the attacks
# (names that are not the field's, Python escapes, operators outside the language, huge numbers) stay frequent.
ATTACKS = ["nope", "__import__", "x.__class__", "v[0]", "'s'", "lambda: 0", "1e31", "10**29", "2**64", "(9**9**9)"]
NUMBERS = ["0", "1", "2", "0.5", "3", "64", "1e30", "1e-300", "1000"]
UNARY = ["exp", "log", "sqrt", "sigmoid", "tanh", "abs", "heaviside", "erf", "sin", "atan"] * 2 + ["eval", "open"]
BINARY = ["+", "-", "*", "/", "**"] * 4 + ["%", "//", "<<", "&", " and ", " if ", ","]
FIELD_NAMES = {"charge": ["v", "w", "x", "tau", "k", "d", "pi"], "threshold": ["v", "w", "tau", "k", "d", "e"],
               "updates": ["v", "w", "x", "h", "s", "tau", "d"], "derived": ["tau", "k", "pi", "e"]}
RESETS, KINDS = ["hard", "soft", "none"], ["scalar", "constant", "tensor"]
DRAWN: set[tuple[str, str]] = set()  # (branch, choice) of every branch of the generator taken in this process


def drawn(branch: str, choice: str, value: str) -> str:
    DRAWN.add((branch, choice))
    return value


def branches() -> set[tuple[str, str]]:
    """Every (branch, choice) of the generator: each field's names, each other leaf (numbers, attacks) in some field,
    each operator, function and form, each reset rule and parameter kind."""
    names = {(f"{field} name", name) for field, names in FIELD_NAMES.items() for name in names}
    forms = {("form", form) for form in ("binary", "unary", "min", "max", "where", "negation")}
    tokens = {("leaf", leaf) for leaf in NUMBERS + ATTACKS} | {("binary", b) for b in BINARY} | {
        ("unary", u) for u in UNARY}
    return names | forms | tokens | {("reset", r) for r in RESETS} | {("kind", k) for k in KINDS}


def _expressions(field: str, names: list[str]) -> st.SearchStrategy[str]:
    leaves = st.sampled_from(names * 4 + NUMBERS * 2 + ATTACKS).map(
        lambda leaf: drawn(f"{field} name" if leaf in names else "leaf", leaf, leaf))

    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(BINARY), inner).map(
                lambda t: drawn("form", "binary", drawn("binary", t[1], f"({t[0]}{t[1]}{t[2]})"))),
            st.tuples(st.sampled_from(UNARY), inner).map(
                lambda t: drawn("form", "unary", drawn("unary", t[0], f"{t[0]}({t[1]})"))),
            st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(
                lambda t: drawn("form", t[0], f"{t[0]}({t[1]}, {t[2]})")),
            st.tuples(inner, inner, inner).map(
                lambda t: drawn("form", "where", f"where({t[0]} < {t[1]}, {t[2]}, {t[0]})")),
            inner.map(lambda e: drawn("form", "negation", f"-{e}")),
        )

    return st.recursive(leaves, grow, max_leaves=12)


# built once: building them per draw made generation cost 20 times the checks
EXPRESSIONS = {field: _expressions(field, names) for field, names in FIELD_NAMES.items()}


@st.composite
def fuzzed_specs(draw) -> str:
    charge, threshold, update, derived = (draw(EXPRESSIONS[f]) for f in ("charge", "threshold", "updates", "derived"))
    reset, kind = draw(st.sampled_from(RESETS)), draw(st.sampled_from(KINDS))
    drawn("reset", reset, reset)
    drawn("kind", kind, kind)
    return (f'charge = {_toml(charge)}\nthreshold = {_toml(threshold)}\nreset = "{reset}"\n'
            f'[params]\ntau = {{ default = 2.0, kind = "{kind}" }}\nk = 0.5\nv_threshold = 1.0\nv_reset = 0.0\n'
            f'[states]\nv = 0.0\nw = 0.0\n[updates]\nw = {_toml(update)}\n[derived]\nd = {_toml(derived)}\n')


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class FuzzLog:
    def __init__(self) -> None:
        self.accepted: list = []
        self.refused = 0
        self.slowest = 0.0


@pytest.fixture(scope="module")
def fuzz_log() -> FuzzLog:
    return FuzzLog()


def test_fuzzed_specs_are_refused_in_time_or_derive(fuzz_log, tmp_path, monkeypatch):
    workdir, scratch = tmp_path / "cwd", tmp_path / "tmp"
    workdir.mkdir()
    scratch.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", str(scratch))

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(fuzzed_specs())
    def run(text: str) -> None:
        start = time.process_time()  # CPU time, as the budget: the same on a loaded machine
        try:
            spec = spec_from_toml(text, source="fuzz.toml", default_name="fuzzed")
            kernels.derivation(spec)
        except SpecError as error:
            assert error.source == "fuzz.toml" and (error.field or "TOML" in error.message), error
            fuzz_log.refused += 1
        else:
            fuzz_log.accepted.append(spec)
        fuzz_log.slowest = max(fuzz_log.slowest, time.process_time() - start)

    DRAWN.clear()
    run()
    assert fuzz_log.accepted and fuzz_log.refused
    assert not branches() - DRAWN, f"branches of the generator never drawn: {sorted(branches() - DRAWN)}"
    assert fuzz_log.slowest < budget.budget_seconds() * 4 + 1
    assert not list(workdir.iterdir()), "a fuzzed spec wrote into the working folder"
    assert not [p for p in scratch.iterdir() if not p.name.startswith("autocuda-")], "stray temporary files"


def test_accepted_fuzzed_specs_compile_and_match_their_reference(fuzz_log):
    if not fuzz_log.accepted:
        pytest.skip("the fuzzing test did not run in this session")
    from autocuda.toolchain.compile import nvcc_check

    sample = fuzz_log.accepted[:: max(1, len(fuzz_log.accepted) // 6)][:6]
    # one nvcc run for the sample (each run pays nvcc's start-up and headers); kernels are named by their text
    found = (_widest_needed(spec, kind) for spec in sample for kind in ("fptt", "bptt"))
    try:
        nvcc_check("\n".join({k.kernel_name: k.full_codes for k in found}.values()), archs=("sm_80",),
                   optimise=False)
    except RuntimeError as error:
        if "nvcc was not found" not in str(error):
            raise
    compile_launched(*(functools.partial(_assert_kernels_match_reference, spec) for spec in sample))
    for spec in sample:
        _assert_kernels_match_reference(spec)


def _widest_needed(spec: NeuronSpec, kind: str) -> Any:
    """The float32 kernel, else the float64 one where float32 cannot hold a number of the equations (1e-300)."""
    try:
        return kernels.neuron_kernel(spec, kind, "float32")
    except ConstantRangeError:
        return kernels.neuron_kernel(spec, kind, "float64")


def _assert_kernels_match_reference(spec: NeuronSpec) -> None:
    """The host runner's kernels against the reference, float64, forward and backward (NaN and inf included:
    random equations produce them, and both paths must agree on them too)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    results = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        spikes, finals, _ = F.multi_step(spec, leaf, backend=backend)
        loss = spikes.sum() + sum(final.nan_to_num(0.0, 0.0, 0.0).sum() for final in finals)
        grad = torch.autograd.grad(loss, leaf, allow_unused=True)[0] if loss.requires_grad else None
        results.append((spikes, *finals, torch.zeros_like(x) if grad is None else grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, equal_nan=True)


def test_a_charge_free_of_input_and_states_still_gives_one_spike_per_neuron():
    # found by the fuzzer: the reference returned spikes of shape [T] for a constant charge
    spec = NeuronSpec(name="constant", params={"v_threshold": 1.0}, states={"v": 0.0}, charge="1", reset="none")
    _assert_kernels_match_reference(spec)


def test_a_where_compared_inside_a_condition_prints_and_matches():
    # found by the fuzzer: sympy writes `0 < where(v < x, x, v)` as ITE(v < x, x > 0, v > 0), which neither the
    # printer nor the reference knew
    spec = lif("-where(0 < where(v < x, x, v), -x, 0)", reset="hard", params={**LIF_PARAMS, "tau": 2.0},
               threshold="tau")
    derived_everything(spec)
    _assert_kernels_match_reference(spec)


def test_a_threshold_of_a_state_without_gradient_compiles_in_the_backward_kernel():
    """Found by the fuzzer: the backward recomputes the threshold at every step, so it loads the states the
    threshold reads even where no gradient flows through them (here it read w without loading it: usr_w undefined).
    The threshold is piecewise constant in w, and w' = x."""
    spec = NeuronSpec(name="fuzzed", params={"tau": {"default": 2.0, "kind": "tensor"}, "v_threshold": 1.0,
                                             "v_reset": 0.0}, states={"v": 0.0, "w": 0.0}, charge="-1",
                      threshold="-where(w > 1e29, 1e-300, 1e29)", updates={"w": "x"}, reset="hard")
    _assert_kernels_match_reference(spec)
