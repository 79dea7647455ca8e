"""The symbolic budget is one per spec load (autocuda.spec.budget): every stage from a spec's text or step function
to one of its kernels (trace, mapping, parse, derivation, rendering) counts against one budget of CPU time, so
an attack is refused within the budget from the start of its load, not within the budget of each stage.

Times are the process's CPU time (time.process_time): the same on a loaded machine as on an idle one.
"""
from __future__ import annotations

import resource
import time

import pytest
import torch

from autocuda.base.errors import SpecError
from autocuda.codegen import kernels
from autocuda.spec import budget
from autocuda.spec.load import load_spec
from autocuda.spec.model import NeuronSpec, Param
from autocuda.spec.python import from_trace, neuron
from autocuda.spec.surrogate import Sigmoid
from autocuda.spec.trace import trace

BUDGET = 1.0   # seconds of CPU time for a whole load in these tests (the attacks need many times more)
MARGIN = 0.75  # CPU seconds of the process beside its stages' own: validation, hashing, the watching thread
MEMORY = 2 ** 30  # bytes: the most a refusal may grow the process (its peak resident size)
sg = Sigmoid()


@pytest.fixture(autouse=True)
def small_budget(monkeypatch, tmp_path):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, str(BUDGET))
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))


def refusal(load) -> tuple[SpecError, float]:
    """The SpecError of loading a spec (`load()`) and rendering its kernels, and the CPU seconds it took."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.process_time()
    with pytest.raises(SpecError) as caught:
        spec = load()
        kernels.source(spec, "fptt")
        kernels.source(spec, "bptt")
    seconds = time.process_time() - start
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < MEMORY
    return caught.value, seconds


# -- attacks: each stage within a budget of its own, the load far past one ---------------------------------------
def nested(state: str, depth: int) -> str:
    text = state
    for i in range(1, depth + 1):
        text = f"sigmoid({state} * {i} + {text})"
    return text


def nested_toml(depth: int) -> str:
    """A spec whose parse takes most of the budget and whose derivation takes several budgets."""
    updates = "\n".join(f'w{k} = "{nested(f"w{k}", depth)} + s"' for k in range(3))
    return (f'name = "attack"\ncharge = "{nested("v", depth)} + x + w0 + w1 + w2"\n'
            f'[params]\ntau = 2.0\nv_threshold = 1.0\nv_reset = 0.0\n'
            f'[states]\nv = 0.0\nw0 = 0.0\nw1 = 0.0\nw2 = 0.0\n[updates]\n{updates}\n')


def test_a_toml_spec_is_refused_within_one_budget_for_all_its_stages(tmp_path):
    path = tmp_path / "attack.toml"
    path.write_text(nested_toml(20))
    error, seconds = refusal(lambda: load_spec(str(path)))
    assert seconds < BUDGET + MARGIN, f"refused after {seconds:.2f} s of CPU time"
    assert f"budget of {BUDGET:g} s of CPU time" in error.message and error.source == str(path) and error.field, error


def nest(u, depth: int = 14):
    t = u
    for i in range(1, depth + 1):
        t = torch.sigmoid(u * i + t)
    return t


def nested_step(x, v, w0, w1, w2):
    h = nest(v) + x + w0 + w1 + w2
    s = sg(h - 1.0)
    return s, h * (1 - s), nest(w0) + s, nest(w1) + s, nest(w2) + s


def test_a_python_step_is_refused_within_one_budget_for_all_its_stages():
    error, seconds = refusal(lambda: neuron(nested_step))
    assert seconds < BUDGET + MARGIN, f"refused after {seconds:.2f} s of CPU time"
    assert f"budget of {BUDGET:g} s of CPU time" in error.message and error.field, error
    assert error.source.startswith(f"{__file__}:"), error  # the step's definition, file:line


# -- the chain ----------------------------------------------------------------------------------------------------
class Product:
    """A stage's result that a later stage builds on (a parse, a derivation)."""


def spin(seconds: float) -> None:
    """Work for `seconds` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def made(seconds: float) -> Product:
    spin(seconds)
    return Product()


def test_a_stage_counts_the_time_of_the_stages_it_builds_on(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.3")
    product = budget.bounded("<test>", "charge", made, 0.2)
    assert budget.bounded("<test>", "charge", made, 0.2)  # a stage alone: within the budget
    with pytest.raises(SpecError, match="earlier stages it builds on") as caught:
        budget.bounded("<test>", "threshold", lambda: budget.reuse(product) or spin(0.2))
    assert caught.value.field == "threshold"


def test_a_result_made_in_the_same_stage_counts_once(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "0.3")

    def stage() -> str:
        product = budget.bounded("<test>", "charge", made, 0.15)  # a nested stage: part of this one
        budget.reuse(product)
        budget.reuse(product)
        spin(0.05)
        return "done"

    assert budget.bounded("<test>", "charge", stage) == "done"


def test_outside_a_stage_nothing_is_counted():
    budget.reuse(budget.bounded("<test>", "charge", made, 0.0))
    budget.reuse(object())


def lif() -> NeuronSpec:
    return NeuronSpec(name="chain", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0},
                      charge="v + (x - v) / tau")


def cost(result: object) -> float:
    recorded = budget._costs.of(result)
    assert recorded is not None, result
    return recorded[1]


def test_a_spec_s_stages_record_the_chain_that_made_them():
    spec = lif()
    parsed, derivation = spec.parsed(), kernels.derivation(spec)
    assert 0 < cost(parsed) <= cost(derivation)  # the derivation, a later stage, counts the parse


def lif_step(x, v, tau=2.0):
    h = v + (x - v) / tau
    s = sg(h - 1.0)
    return s, h * (1 - s)


def test_a_step_s_spec_counts_its_trace():
    traced = trace(lif_step, ["x", "v", "tau"])
    step = from_trace(traced, ["x"], ["v"], [Param("tau", 2.0)], origin="<test>")
    assert 0 < cost(traced) <= cost(step.spec.parsed())


# -- legitimate specs ----------------------------------------------------------------------------------------------
def test_sixty_states_load_under_the_default_budget(monkeypatch):
    monkeypatch.setenv(budget.BUDGET_VARIABLE, str(budget.DEFAULT_SECONDS))
    names = ["v", *(f"u{i}" for i in range(1, 60))]
    ode = {"v": "-v / tau + x"} | {name: f"-{name} / tau{i} + x" for i, name in enumerate(names[1:], 1)}
    params = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, **{f"tau{i}": 2.0 + i for i in range(1, 60)}}
    start = time.process_time()
    spec = NeuronSpec(name="wide", params=params, states=dict.fromkeys(names, 0.0), ode=ode)
    kernels.source(spec, "fptt")
    kernels.source(spec, "bptt")
    assert time.process_time() - start < 2 * budget.DEFAULT_SECONDS
