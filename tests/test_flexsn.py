"""autocuda.nn.FlexSN against SpikingJelly 2.0's FlexSN (its torch path on CPU, float64): the same core function
object gives equal spikes and states and gradients within rounding, on the reference and on the host runner."""
from __future__ import annotations

import copy
import functools
import pickle

import pytest
import torch
from backends import CPU_BACKENDS
from conftest import compile_launched

from autocuda.base.errors import SpecError
from autocuda.nn import FlexSN
from autocuda.toolchain.host import cxx as toolchain

sj_flexsn = pytest.importorskip("spikingjelly.activation_based.neuron.flexsn")
surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")

sg = surrogate.Sigmoid(alpha=4.0)


def lif_core_sg(x: torch.Tensor, v: torch.Tensor):  # SpikingJelly's example core, as it writes it
    tau, v_th = 2.0, 1.0
    h = v + (x - v) / tau
    s = sg(h - v_th)
    return s, h * (1.0 - s)


def alif_core(x, v, a, tau, beta):
    h = v + (x - v) / tau
    s = surrogate.atan.apply(h - (1.0 + beta * a), 2.0)
    return s, h * (1.0 - s.detach()), 0.9 * a + s


def eif_core(x, v, tau, theta_rh):  # theta_rh: learnable, one per neuron
    h = v + (x - v + 0.5 * torch.exp((v - theta_rh) / 0.5)) / tau
    s = sg(h - 1.0)
    return s, h * (1.0 - s) - 0.1 * s


def multi_core(x, v, tau):  # outputs: the spike, the charge, a new state
    h = v + (x - v) / tau
    s = sg(h - 1.0)
    v_new = h * (1.0 - s) - 0.1 * s
    return s, h, v_new, v_new


N = 6


def _cases():
    f64 = torch.float64
    return {
        "lif": (lif_core_sg, 1, lambda: ()),
        "alif": (alif_core, 2, lambda: (torch.nn.Parameter(torch.full((N,), 2.0, dtype=f64)),
                                        torch.tensor(0.3, dtype=f64))),
        "eif": (eif_core, 1, lambda: (torch.tensor([2.0], dtype=f64),
                                      torch.nn.Parameter(torch.linspace(0.6, 0.9, N, dtype=f64)))),
        "multi": (multi_core, 1, lambda: (torch.nn.Parameter(torch.linspace(1.5, 3.0, N, dtype=f64)),)),
    }


BACKENDS = CPU_BACKENDS


def _loss(outputs, states) -> torch.Tensor:
    total = sum((o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outputs)
    return total + sum((s * 0.7).sum() for s in states)


def _both(name: str, step_mode: str, backend: str):
    core, num_states, statics = _cases()[name]
    ours = FlexSN(core, num_states, statics(), step_mode=step_mode, store_state_seqs=True, backend=backend)
    theirs = sj_flexsn.FlexSN(core, num_states, statics(), step_mode=step_mode, store_state_seqs=True)
    return ours, theirs


def _call(layer, *x):
    out = layer(*x)
    return out if isinstance(out, tuple) else (out,)


def _compare(ours, theirs, xs) -> None:
    """Run both over the inputs `xs` (one call each), then compare outputs, states and gradients."""
    inputs = [x.clone().requires_grad_() for x in xs]
    mine = [_call(ours, x) for x in inputs]
    their = [_call(theirs, x) for x in inputs]
    for a, b in zip(mine, their):
        assert torch.equal(a[0], b[0])  # the spikes
        for p, q in zip(a[1:], b[1:]):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    for p, q in zip(ours.states, theirs.states):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    if ours.step_mode == "m":
        for p, q in zip(ours.state_seqs, theirs.state_seqs):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    leaves = inputs + [p for p in ours.parameters()]
    their_leaves = inputs + [p for p in theirs.parameters()]
    g1 = torch.autograd.grad(_loss([o for out in mine for o in out], ours.states), leaves)
    g2 = torch.autograd.grad(_loss([o for out in their for o in out], theirs.states), their_leaves)
    for p, q in zip(g1, g2):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the tests below, compiled up front many to a compiler run (`conftest.compile_launched`):
    each test would compile its own in a compiler run of their own. The calls are the tests' own on the host."""
    if toolchain.missing() is not None:
        return 0

    def calls(make, inputs: list[tuple[torch.Tensor, ...]], grad: bool = True) -> None:
        layer, outputs = make(), []
        for xs in inputs:
            outputs += _call(layer, *(x.clone().requires_grad_(grad) for x in xs))
        if grad:
            _loss(outputs, layer.states).backward()

    def flexsn(core, num_states: int, statics, step_mode: str):
        return functools.partial(FlexSN, core, num_states, statics(), step_mode=step_mode, store_state_seqs=True,
                                 backend="host")

    x = torch.rand(12, N, dtype=torch.float64)
    made = [(flexsn(*_cases()[name], "m"), [(x[:7],), (x[7:],)]) for name in MULTI_STEP]
    made += [(flexsn(*_cases()[name], "s"), [(step,) for step in x[:5]]) for name in SINGLE_STEP]
    made += [(flexsn(*case, step_mode), [(x[:7], x[:7]) if step_mode == "m" else (x[0], x[0])])
             for case in SEVERAL_INPUTS for step_mode in ("m", "s")]
    leaky = functools.partial(FlexSN, leaky_core, 1, store_state_seqs=True, backend="host")
    return compile_launched(functools.partial(calls, leaky, [(x[:6],)], grad=False),
                            *(functools.partial(calls, make, inputs) for make, inputs in made))


MULTI_STEP, SINGLE_STEP = ["lif", "alif", "eif", "multi"], ["lif", "alif", "multi"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", MULTI_STEP)
def test_multi_step_matches_spikingjelly(name: str, backend: str) -> None:
    ours, theirs = _both(name, "m", backend)
    torch.manual_seed(0)
    x = torch.rand(12, N, dtype=torch.float64) * 2.5
    _compare(ours, theirs, [x[:7], x[7:]])  # two calls: the states carry over


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SINGLE_STEP)
def test_single_step_matches_spikingjelly(name: str, backend: str) -> None:
    ours, theirs = _both(name, "s", backend)
    torch.manual_seed(1)
    _compare(ours, theirs, list(torch.rand(5, N, dtype=torch.float64) * 2.5))


def test_reset_states_and_registration() -> None:
    ours, theirs = _both("alif", "m", "reference")
    assert dict(ours.named_parameters()).keys() == dict(theirs.named_parameters()).keys()
    assert set(dict(ours.named_buffers())) == {"_static_input_1"}
    assert ours.states == (None, None)
    ours(torch.rand(3, N, dtype=torch.float64))
    assert all(isinstance(s, torch.Tensor) and s.shape == (N,) for s in ours.states)
    assert len(ours.state_seqs) == 2 and ours.state_seqs[0].shape == (3, N)
    ours.reset()
    assert ours.states == (None, None) and ours.state_seqs is None
    ours.states = (torch.ones(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected 2"):
        ours.states = (torch.ones(N),)


def test_eager_backend_runs_the_core() -> None:
    ours, theirs = _both("multi", "m", "eager")
    x = torch.rand(4, N, dtype=torch.float64) * 2
    for a, b in zip(ours(x), theirs(x)):
        torch.testing.assert_close(a, b)


def test_a_batch_of_neurons_and_the_spec() -> None:
    layer = FlexSN(lif_core_sg, 1)
    out = layer(torch.rand(4, 2, 3) * 3)
    assert out.shape == (4, 2, 3)
    assert "h = 0.5*v + 0.5*x" in layer.spec.source("fptt")


def test_copies_keep_working() -> None:
    layer = FlexSN(lif_core_sg, 1)
    clone, restored = copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))
    x = torch.rand(5, 3) * 3
    expected = layer(x)
    assert torch.equal(clone(x), expected) and torch.equal(restored(x), expected)


def two_input_core(x_exc, x_inh, v, tau):  # two input sequences, read through one value of them
    h = v + ((x_exc - 0.5 * x_inh) - v) / tau
    s = sg(h - 1.0)
    return s, h, h * (1.0 - s)


def conductance_core(g_e, g_i, v, tau, E_e, E_i):  # each input meets the membrane on its own
    h = v + (g_e * (E_e - v) + g_i * (E_i - v) - v) / tau
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def gated_input_core(x, gate, v):  # the inputs combine non-linearly, then meet the state once
    h = 0.5 * v + torch.where(gate > 0.5, x, 0.2 * x) * torch.sigmoid(gate)
    s = surrogate.atan.apply(h - 1.0, 2.0)
    return s, h * (1.0 - s)


def compared_inputs_core(x, y, v):  # the inputs meet in a condition and beside the state
    h = torch.where(x > y, 0.5 * v + x, 0.5 * v) + 0.2 * y * v
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


SEVERAL_INPUTS = [
    (two_input_core, 1, lambda: (torch.nn.Parameter(torch.linspace(1.5, 3.0, N, dtype=torch.float64)),)),
    (gated_input_core, 1, lambda: ()),
    (conductance_core, 1, lambda: (torch.nn.Parameter(torch.linspace(1.5, 3.0, N, dtype=torch.float64)),
                                   torch.nn.Parameter(torch.tensor(3.0, dtype=torch.float64)),
                                   torch.tensor(-1.0, dtype=torch.float64))),
    (compared_inputs_core, 1, lambda: ())]


@pytest.mark.parametrize("backend", [*BACKENDS, "eager"])
@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("core, num_states, statics", SEVERAL_INPUTS, ids=["two", "gated", "conductance", "compared"])
def test_several_step_inputs_match_spikingjelly(core, num_states, statics, step_mode: str, backend: str) -> None:
    ours = FlexSN(core, num_states, statics(), step_mode=step_mode, store_state_seqs=True, backend=backend)
    theirs = sj_flexsn.FlexSN(core, num_states, statics(), step_mode=step_mode, store_state_seqs=True)
    torch.manual_seed(2)
    shape = (7, N) if step_mode == "m" else (N,)
    inputs = [(torch.rand(shape, dtype=torch.float64) * 3).requires_grad_(),
              torch.rand(shape, dtype=torch.float64).requires_grad_()]
    mine, their = _call(ours, *inputs), _call(theirs, *inputs)
    assert torch.equal(mine[0], their[0])
    for p, q in zip((*mine[1:], *ours.states), (*their[1:], *theirs.states)):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    g1 = torch.autograd.grad(_loss(mine, ours.states), [*inputs, *ours.parameters()])
    g2 = torch.autograd.grad(_loss(their, theirs.states), [*inputs, *theirs.parameters()])
    for p, q in zip(g1, g2):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="takes 2 step inputs, got 1"):
        ours(inputs[0])


def test_several_step_inputs_are_the_specs_inputs() -> None:
    """Each step input is an input of the spec, named as the core names it: the kernels read a sequence and
    write a gradient sequence for each; a core with one input reads it as x, whatever it calls it."""
    tau, e_e, e_i = (torch.tensor(value, dtype=torch.float64) for value in (2.0, 3.0, -1.0))
    two = FlexSN(conductance_core, 1, (tau, e_e, e_i))
    assert two.spec.inputs == ("g_e", "g_i") and two.step.num_inputs == 2
    assert two.spec.reset == "hard" and [s.name for s in two.spec.states] == ["v"]
    forward, backward = two.spec.source("fptt"), two.spec.source("bptt")
    assert all(f"usr_{name}_seq" in forward and f"usr_grad_{name}_seq" in backward for name in ("g_e", "g_i"))
    assert FlexSN(lambda current, v: (sg(v + current - 1.0), v + current), 1).spec.inputs == ("x",)
    # names the spec language or the kernels' arguments take are respelled
    assert FlexSN(lambda h, s, v: (sg(v + h * s - 1.0), v + h * s), 1).spec.inputs == ("h_input", "s_input")


def test_constructor_errors() -> None:
    with pytest.raises(TypeError, match="static_inputs\\[0\\]"):
        FlexSN(lif_core_sg, 0, (1.0,))
    with pytest.raises(ValueError, match="num_states"):
        FlexSN(lif_core_sg, -1)
    with pytest.raises(ValueError, match="backend"):
        FlexSN(lif_core_sg, 1, backend="triton")
    with pytest.raises(ValueError, match="step_mode"):
        FlexSN(lif_core_sg, 1, step_mode="x")
    with pytest.raises(SpecError, match="fewer than its 2 states"):
        FlexSN(lambda x, v, w: v + x, 2)


def leaky_core(x, v):  # no spike: the outputs are plain values
    v = v * 0.5 + x
    return v * 2.0, torch.tanh(v), v


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_core_without_a_spike(backend: str) -> None:
    ours = FlexSN(leaky_core, 1, store_state_seqs=True, backend=backend)
    theirs = sj_flexsn.FlexSN(leaky_core, 1, store_state_seqs=True)
    x = torch.rand(6, N, dtype=torch.float64)
    for a, b in zip(ours(x), theirs(x)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.states[0], theirs.states[0], rtol=1e-12, atol=1e-12)


def test_a_warm_cache_maps_the_trace_without_sympy(tmp_path, monkeypatch) -> None:
    """A second process finds the traced spec on disk: it does not import sympy to build the layer. The first is
    this one (the mapping onto a spec runs here, and writes it into the cache); only the second is a new
    process (`python_children`: torch imported, nothing of ours), where sympy's import can be seen."""
    import runpy

    import python_children

    from autocuda.spec import python as spec_python

    script = ("import sys, torch\nfrom autocuda.nn import FlexSN\nfrom autocuda.spec.surrogate import Sigmoid\n"
              "sg = Sigmoid()\ndef core(x, v):\n    h = v + (x - v) / 3.0\n    s = sg(h - 1.0)\n"
              "    return s, h * (1.0 - s)\nFlexSN(core, 1)\nprint('sympy' in sys.modules)\n")
    path = tmp_path / "core.py"
    path.write_text(script)
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    mapped = []
    from_trace = spec_python.from_trace
    monkeypatch.setattr(spec_python, "from_trace", lambda *a, **k: mapped.append(1) or from_trace(*a, **k))
    runpy.run_path(str(path), run_name="__main__")  # the cold cache: the trace is mapped (sympy), and kept
    assert mapped == [1]
    second = python_children.run([str(path)], timeout=120)
    assert second.stdout.strip() == "False", second.stderr[-2000:]
