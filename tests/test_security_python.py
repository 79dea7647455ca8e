"""Python neurons under the bounds of TOML specs (autocuda.spec.trace, autocuda.spec.python, autocuda.spec.purity):
size, exponents, numbers, nesting, loop length, time, stack and memory, each refused with a SpecError naming the
step's line and the limit; random numbers, clocks and the environment refused by name at the line that reads or
calls them.

Each refusal is checked in bounded time (a ceiling far above what it takes, as in test_security.py: a regression
fails instead of hanging) and bounded memory (tracemalloc's peak: what Python allocated, sympy's integers and
expressions included).
"""
from __future__ import annotations

import datetime
import gc
import inspect
import math
import os
import random
import secrets
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
import torch

from autocuda.base.errors import SpecError
from autocuda.spec import budget
from autocuda.spec import trace as trace_module
from autocuda.spec.python import neuron, step_spec
from autocuda.spec.surrogate import Custom, Sigmoid

sg = Sigmoid()
CEILING = 6.0           # CPU seconds of the process (not wall time: no test depends on load): above the
                        # symbolic budget of one load (4), far below "hangs"
MEMORY = 200 * 2 ** 20  # bytes Python may allocate while refusing (the cases took gigabytes)
RNG = np.random.default_rng(0)
GAIN = 0.5


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))


def refused(step: Callable, *, states=("v",)) -> SpecError:
    """The SpecError of mapping `step`, checked to come within the ceiling and the memory bound."""
    tracemalloc.start()
    start = time.process_time()
    try:
        with pytest.raises(SpecError) as caught:
            step_spec(step, list(states), [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - start < CEILING
    assert peak < MEMORY, f"{peak / 2 ** 20:.0f} MiB"
    return caught.value


def line_of(step: Callable, text: str) -> str:
    """file:line of the first line of `step` that contains `text`."""
    lines, first = inspect.getsourcelines(step)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{inspect.getsourcefile(step)}:{first + offset}"


def assert_at(error: SpecError, step: Callable, text: str, *limit: str) -> None:
    """The error names the step's line that holds `text` (as file:line and as source) and each of `limit`."""
    assert error.source == line_of(step, text), error
    assert text in error.message, error
    for word in limit:
        assert word in error.message, error


# -- size, exponents, numbers, nesting, loop length -------------------------------------------------------------
def huge_power_times_zero(x, v):
    h = v + x + 0 * (2 * v) ** (10 ** 29)
    s = sg(h - 1.0)
    return s, h * (1 - s)


def large_power(x, v):
    h = v + x + (2 * v) ** (10 ** 7)
    s = sg(h - 1.0)
    return s, h * (1 - s)


def long_loop(x, v):
    h = v
    for _ in range(5000):
        h = h + (x - h) / 2.0
    s = sg(h - 1.0)
    return s, h * (1 - s)


def endless_loop(x, v):
    h = v
    for _ in range(10 ** 6):
        h = h * 0.999 + x
    s = sg(h - 1.0)
    return s, h * (1 - s)


def repeated_operation(x, v):
    h = v
    for _ in range(10 ** 6):
        h = v * 2.0  # the same node every time: only the count of operations stops it
    s = sg(h - 1.0)
    return s, h * (1 - s)


def nested_tanh(x, v):
    h = v + x
    for _ in range(3000):
        h = torch.tanh(h)
    s = sg(h - 1.0)
    return s, h * (1 - s)


def huge_number(x, v):
    h = v + x * 1e31
    s = sg(h - 1.0)
    return s, h * (1 - s)


def exp_of_a_log(x, v):
    h = v + torch.exp(1000 * torch.log(x))
    s = sg(h - 1.0)
    return s, h * (1 - s)


def folded_constants(x, v):
    h = v + (x * 1e20) * 1e20
    s = sg(h - 1.0)
    return s, h * (1 - s)


BOUNDS = {
    "0 * power of 10**29": (huge_power_times_zero, "(2 * v) ** (10 ** 29)", ("exponent", "64")),
    "power of 10**7": (large_power, "(2 * v) ** (10 ** 7)", ("exponent", "64")),
    "5000 iterations": (long_loop, "h = h + (x - h) / 2.0", (str(budget.MAX_NODES),)),
    "10**6 iterations": (endless_loop, "h = h * 0.999 + x", (str(trace_module.MAX_DEPTH), "deep")),
    "10**6 repeats": (repeated_operation, "h = v * 2.0", (str(trace_module.MAX_OPERATIONS), "operations")),
    "3000 nested tanh": (nested_tanh, "h = torch.tanh(h)", (str(trace_module.MAX_DEPTH), "deep")),
    "number past 1e30": (huge_number, "x * 1e31", ("1e+30",)),
    "exp of 1000 logs": (exp_of_a_log, "torch.exp(1000 * torch.log(x))", ("exp", "64")),
    "constants folded past 1e30": (folded_constants, "(x * 1e20) * 1e20", ("1e+30",)),
}


@pytest.mark.parametrize("case", BOUNDS)
def test_steps_past_a_bound_are_refused_at_their_line(case):
    step, text, limit = BOUNDS[case]
    assert_at(refused(step), step, text, *limit)


def recursive(x, v):
    return recursive(x, v)


def test_a_step_that_recurses_without_end_is_refused_at_its_line():
    error = refused(recursive)
    assert_at(error, recursive, "return recursive(x, v)", "stack ran out")


def busy_python(x, v):
    total = 0
    for i in range(10 ** 9):
        total += i
    return sg(v + x - 1.0), v + x


def test_a_step_past_its_cpu_budget_is_refused_naming_where_it_was(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.2")
    error = refused(busy_python)
    assert "budget of 0.2 s of CPU time" in error.message
    assert "busy_python()" in error.message and "total += i" in error.message or "for i in range" in error.message


def test_the_step_limits_leave_room_for_real_neurons():
    # four Euler substeps of a LIF: a step longer than a shipped neuron's, inside every limit
    def substeps(x, v, tau=2.0):
        h = v
        for _ in range(4):
            h = h + (x - h) / (4 * tau)
        s = sg(h - 1.0)
        return s, h * (1 - s)

    spec = neuron(substeps)
    assert spec.reset == "hard"


# -- impure calls ---------------------------------------------------------------------------------------------
def python_random(x, v):
    h = v + x * random.random()
    return sg(h - 1.0), h


def python_gauss(x, v):
    h = v + x * random.gauss(0.0, 1.0)
    return sg(h - 1.0), h


def numpy_random(x, v):
    h = v + x * np.random.rand()
    return sg(h - 1.0), h


def numpy_generator(x, v):
    h = v + x * RNG.normal()
    return sg(h - 1.0), h


def torch_rand(x, v):
    h = v + x * torch.rand(1).item()
    return sg(h - 1.0), h


def torch_randn_like(x, v):  # of a step value it is a draw of the spec (tests/test_noise_specs.py)
    h = v + x * float(torch.randn_like(torch.zeros(())))
    return sg(h - 1.0), h


def torch_bernoulli(x, v):
    h = v + x * float(torch.bernoulli(torch.tensor(0.5)))
    return sg(h - 1.0), h


def torch_distribution(x, v):
    h = v + x * torch.distributions.Normal(0.0, 1.0).sample().item()
    return sg(h - 1.0), h


def clock(x, v):
    h = v + x * (time.time() % 1)
    return sg(h - 1.0), h


def perf_counter(x, v):
    h = v + x * time.perf_counter()
    return sg(h - 1.0), h


def now(x, v):
    h = v + x * datetime.datetime.now().microsecond
    return sg(h - 1.0), h


def environment(x, v):
    h = v + x * float(os.environ.get("GAIN", "1"))
    return sg(h - 1.0), h


def getenv(x, v):
    h = v + x * float(os.getenv("GAIN", "1"))
    return sg(h - 1.0), h


def from_secrets(x, v):
    h = v + x * secrets.randbelow(10)
    return sg(h - 1.0), h


def noise() -> float:
    return random.uniform(0.0, 1.0)


def through_a_helper(x, v):
    h = v + x * noise()
    return sg(h - 1.0), h


IMPURE = {
    "random.random": (python_random, "random.random()", "random numbers"),
    "random.gauss": (python_gauss, "random.gauss(0.0, 1.0)", "random numbers"),
    "numpy.random.rand": (numpy_random, "np.random.rand()", "random numbers"),
    "numpy Generator": (numpy_generator, "RNG.normal()", "random numbers"),
    "torch.rand": (torch_rand, "torch.rand(1)", "random numbers"),
    "torch.randn_like": (torch_randn_like, "torch.randn_like(torch.zeros(()))", "random numbers"),
    "torch.bernoulli": (torch_bernoulli, "torch.bernoulli", "random numbers"),
    "torch.distributions": (torch_distribution, "sample()", "random numbers"),
    "time.time": (clock, "time.time()", "clock"),
    "time.perf_counter": (perf_counter, "time.perf_counter()", "clock"),
    "datetime.now": (now, "datetime.datetime.now()", "clock"),
    "os.environ": (environment, "os.environ.get", "environment"),
    "os.getenv": (getenv, "os.getenv", "environment"),
    "secrets": (from_secrets, "secrets.randbelow(10)", "random numbers"),
    "a helper": (noise, "random.uniform(0.0, 1.0)", "random numbers"),
}


@pytest.mark.parametrize("call", IMPURE)
def test_impure_calls_are_refused_by_name_at_their_line(call):
    step, text, kind = IMPURE[call]
    error = refused(through_a_helper if step is noise else step)
    assert_at(error, step, text, kind)
    assert call.split(".")[-1].split(" ")[0].lower() in error.message.lower(), error


def test_constants_from_the_step_and_its_module_are_kept():
    # literals, math, a module's number and a surrogate built inside the step (sympy draws numbers of its own
    # there): all constants of the step, nothing that changes from call to call
    def step(x, v):
        h = v + x * GAIN * math.exp(-1.0) + math.pi
        s = Custom("1 / (1 + abs(x))")(h - 1.0)
        return s, h * (1 - s)

    spec = step_spec(step, ["v"], []).spec
    assert "0.5" in spec.charge or "0.18" in spec.charge, spec.charge


def test_a_refused_step_leaves_no_watch_behind():
    refused(python_random)
    assert random.random() < 1.0  # the caller draws numbers as before
    step_spec(lambda x, v: (sg(v + x - 1.0), v + x), ["v"], [])  # and the next step traces


# -- a fuzzer of steps ---------------------------------------------------------------------------------------------
FUZZ_OPERATIONS: dict[str, Callable] = {
    "add": lambda h, c, x, v: h + c * x,
    "mul": lambda h, c, x, v: h * c,
    "pow": lambda h, c, x, v: h ** c,
    "tanh": lambda h, c, x, v: torch.tanh(h),
    "exp": lambda h, c, x, v: torch.exp(c * h),
    "where": lambda h, c, x, v: torch.where(h < c, h, v),
    "square": lambda h, c, x, v: h * h + v,
    "div": lambda h, c, x, v: h / (c + v),
}
FUZZ_CONSTANTS = [0, 1, 2, 0.5, -3, 1e-300, 1e20, 1e31, 10 ** 7, 10 ** 29]
FUZZ_REPEATS = [1, 3, 50, 1000, 10 ** 6]


def fuzzed_step(program: list[tuple[str, float, int]]) -> Callable:
    def step(x, v):
        h = v + x
        for name, constant, repeats in program:
            for _ in range(repeats):
                h = FUZZ_OPERATIONS[name](h, constant, x, v)
        s = sg(h - 1.0)
        return s, h * (1 - s)
    return step


def test_fuzzed_steps_are_mapped_or_refused_at_a_line(monkeypatch):
    from conftest import examples
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    monkeypatch.setenv(budget.BUDGET_VARIABLE, "2")
    programs = st.lists(st.tuples(st.sampled_from(sorted(FUZZ_OPERATIONS)), st.sampled_from(FUZZ_CONSTANTS),
                                  st.sampled_from(FUZZ_REPEATS)), min_size=1, max_size=4)

    @settings(max_examples=examples(500, 12), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs)
    def run(program: list[tuple[str, float, int]]) -> None:
        start = time.process_time()
        try:
            step_spec(fuzzed_step(program), ["v"], [])
        except SpecError as error:
            assert error.source.startswith(__file__), error  # a line of the step (or of an operation it calls)
        assert time.process_time() - start < CEILING

    run()


def test_a_garbage_collector_callback_is_no_call_of_the_step(monkeypatch):
    # the interpreter runs gc callbacks (hypothesis's times itself with perf_counter) wherever a step happens to be;
    # an error raised in one would be printed and dropped ("Exception ignored in"), so those are collected here
    def timed(phase, info):
        time.perf_counter()

    def step(x, v):
        gc.collect()
        return sg(v + x - 1.0), v + x

    dropped: list = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    gc.callbacks.append(timed)
    try:
        step_spec(step, ["v"], [])
    finally:
        gc.callbacks.remove(timed)
    assert not dropped, dropped[0].exc_value
