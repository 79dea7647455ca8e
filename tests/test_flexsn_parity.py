"""autocuda.nn.FlexSN as a drop-in for SpikingJelly 2.0's FlexSN: the same core objects, constructor arguments,
attributes and calls, compared in float64 with SpikingJelly's torch path (outputs, state sequences, final states,
gradients of the inputs, of the initial states and of every static input that requires grad), plus its public
functional protocol (`init_states`, `materialize_states`, `single_step_functional_forward`,
`multi_step_functional_forward`), attributes changed after building and the cores one of the two refuses."""
from __future__ import annotations

import functools

import pytest
import torch
from backends import NEEDS_HOST
from conftest import profile

from autocuda.base.errors import SpecError
from autocuda.nn import FlexSN

sj_flexsn = pytest.importorskip("spikingjelly.activation_based.neuron.flexsn", reason="needs SpikingJelly 2.0")
surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")
sj_base = pytest.importorskip("spikingjelly.activation_based.base")
sj_functional = pytest.importorskip("spikingjelly.activation_based.functional")

SLOW = pytest.mark.skipif(profile() != "slow", reason="wide sweep: --slow")
F64 = torch.float64
N = 5
sg = surrogate.Sigmoid(alpha=4.0)
atan = surrogate.ATan()


# -- cores, each a shape of FlexSN use ---------------------------------------------------------------------------
def lif(x, v, tau):
    h = v + (x - v) / tau
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def soft(x, v, v_th):
    h = 0.6 * v + x
    s = atan(h - v_th)
    return s, h - s * v_th


def no_reset(x, v):
    h = 0.6 * v + x
    s = sg(h - 1.0)
    return s, h


def charge_out(x, v):  # outputs: a scaled spike and the charge
    h = 0.5 * v + x
    s = sg(h - 1.0)
    return s * 2.0, h, h * (1.0 - s)


def two_states_two_outputs(x, v, w):  # an output before the spike; two states
    h = 0.5 * v + x - w
    s = sg(h - 1.0)
    return h - 1.0, s, h * (1.0 - s), 0.8 * w + 0.3 * s


def constant_state(x, v, c):  # a state that never changes
    h = 0.5 * v + x + c
    s = sg(h - 1.0)
    return s, h * (1.0 - s), c


def input_state(x, v, last):  # a state that is the input
    h = 0.5 * v + x - 0.2 * last
    s = sg(h - 1.0)
    return s, h * (1.0 - s), x


def spike_state(x, v, prev):  # a state that is the spike
    h = 0.5 * v + x - 0.5 * prev
    s = sg(h - 1.0)
    return s, h * (1.0 - s), s


def new_state_output(x, v):  # an output of the new state
    h = 0.5 * v + x
    s = sg(h - 1.0)
    v_new = h * (1.0 - s) + 0.1 * s
    return s, v_new * v_new, v_new


def old_state_output(x, v):  # an output of the state before the step
    h = 0.5 * v + x
    s = sg(h - 1.0)
    return s, v * 3.0, h * (1.0 - s)


def hard_to(x, v, v_reset, v_th):  # a hard reset to a static input
    h = 0.5 * v + x
    s = sg(h - v_th)
    return s, h * (1.0 - s) + v_reset * s


def adaptive(x, v, a, beta):  # detach_reset, an adaptive threshold
    h = 0.5 * v + x
    s = atan(h - 1.0 - beta * a)
    return s, h * (1.0 - s.detach()), 0.9 * a + s


def izhikevich(x, v, w, a, b):
    h = v + (x + (v + 0.1) * (v - 0.8) - w) / 2.0
    s = sg(h - 1.0)
    return s, h * (1.0 - s), w + (a * (h + 0.1) - w) / 2.0 + b * s


def _p(value) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.as_tensor(value, dtype=F64))


CORES = {  # name: (core, num_states, static inputs, initial states or None)
    "lif_parameter": (lif, 1, lambda: (_p(2.0),), None),
    "lif_buffer_requiring_grad": (lif, 1, lambda: (torch.tensor(2.0, dtype=F64, requires_grad=True),), None),
    "lif_per_neuron": (lif, 1, lambda: (_p(torch.linspace(1.5, 3.0, N)),), None),
    "soft": (soft, 1, lambda: (_p(1.0),), None),
    "no_reset": (no_reset, 1, lambda: (), None),
    "charge_out": (charge_out, 1, lambda: (), None),
    "two_states_two_outputs": (two_states_two_outputs, 2, lambda: (), None),
    "constant_state": (constant_state, 2, lambda: (), lambda: (torch.zeros(N, dtype=F64), torch.rand(N, dtype=F64))),
    "input_state": (input_state, 2, lambda: (), None),
    "spike_state": (spike_state, 2, lambda: (), None),
    "new_state_output": (new_state_output, 1, lambda: (), None),
    "old_state_output": (old_state_output, 1, lambda: (), lambda: (torch.rand(N, dtype=F64),)),
    "hard_to_per_neuron": (hard_to, 1, lambda: (_p(torch.linspace(-0.3, 0.0, N)), _p(0.9)), None),
    "adaptive": (adaptive, 2, lambda: (_p(0.3),), None),
    "izhikevich": (izhikevich, 2, lambda: (_p(0.1), _p(0.05)), None),
}
DEFAULT_CORES = ["lif_buffer_requiring_grad", "two_states_two_outputs", "constant_state", "old_state_output",
                 "hard_to_per_neuron", "adaptive"]
HOST_CORES = ["lif_buffer_requiring_grad", "two_states_two_outputs", "old_state_output"]


def _tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _loss(outputs, states) -> torch.Tensor:
    total = sum((o * torch.linspace(0.3, 1.7, o.numel(), dtype=F64).reshape(o.shape) * (i + 1)).sum()
                for i, o in enumerate(outputs))
    return total + sum(0.7 * s.sum() for s in states)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-12) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def compare(core, num_states: int, statics, initial, backend: str, step_mode: str, calls: int = 2,
            scale: float = 3.0) -> None:
    """Two layers (ours, SpikingJelly's) on copies of the same static inputs, `calls` calls of the same inputs:
    outputs, state sequences, states and the gradients of every input, initial state and static input equal."""
    ours_static, their_static = statics(), statics()
    ours = FlexSN(core, num_states, ours_static, step_mode=step_mode, store_state_seqs=True, backend=backend)
    theirs = sj_flexsn.FlexSN(core, num_states, their_static, step_mode=step_mode, store_state_seqs=True)
    leaves: list[torch.Tensor] = []
    if initial is not None:
        leaves += [v.requires_grad_() for v in initial()]
        ours.states = theirs.states = tuple(leaves)
    generator = torch.Generator().manual_seed(0)
    mine, their = [], []
    for _ in range(calls):
        x = (torch.rand((6, N) if step_mode == "m" else (N,), generator=generator, dtype=F64) * scale - 0.5)
        leaves.append(x.requires_grad_())
        a, b = _tuple(ours(x)), _tuple(theirs(x))
        assert len(a) == len(b)
        for p, q in zip(a, b):
            _close(p, q)
        mine += a
        their += b
        if step_mode == "m":
            for p, q in zip(ours.state_seqs, theirs.state_seqs, strict=True):
                _close(p, q)
        else:
            assert ours.state_seqs is None and theirs.state_seqs is None
    for p, q in zip(ours.states, theirs.states, strict=True):
        _close(p, q)
    g1 = torch.autograd.grad(_loss(mine, ours.states), leaves + [s for s in ours_static if s.requires_grad])
    g2 = torch.autograd.grad(_loss(their, theirs.states), leaves + [s for s in their_static if s.requires_grad])
    for p, q in zip(g1, g2, strict=True):
        _close(p, q, 1e-10)


@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("name", DEFAULT_CORES)
def test_cores_match_spikingjelly(name: str, step_mode: str) -> None:
    core, num_states, statics, initial = CORES[name]
    compare(core, num_states, statics, initial, "reference", step_mode, calls=2 if step_mode == "m" else 3)


@NEEDS_HOST
@pytest.mark.parametrize("name", HOST_CORES)
def test_cores_match_spikingjelly_on_the_host_runner(name: str, monkeypatch) -> None:
    from autocuda.spec import budget
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    core, num_states, statics, initial = CORES[name]
    compare(core, num_states, statics, initial, "host", "m")


@SLOW
@pytest.mark.parametrize("backend", ["reference", pytest.param("host", marks=NEEDS_HOST)])
@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("name", list(CORES))
def test_every_core_matches_spikingjelly(name: str, step_mode: str, backend: str, monkeypatch) -> None:
    from autocuda.spec import budget
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    core, num_states, statics, initial = CORES[name]
    compare(core, num_states, statics, initial, backend, step_mode, calls=2 if step_mode == "m" else 3)


SURROGATES = {  # SpikingJelly's surrogate modules with parameters other than their defaults
    "Sigmoid": lambda: surrogate.Sigmoid(alpha=3.0), "SoftSign": lambda: surrogate.SoftSign(alpha=3.0),
    "SuperSpike": lambda: surrogate.SuperSpike(alpha=2.0), "ATan": lambda: surrogate.ATan(alpha=3.0),
    "NonzeroSignLogAbs": lambda: surrogate.NonzeroSignLogAbs(alpha=2.0), "Erf": lambda: surrogate.Erf(alpha=3.0),
    "PiecewiseLeakyReLU": lambda: surrogate.PiecewiseLeakyReLU(w=0.7, c=0.05),
    "PiecewiseQuadratic": lambda: surrogate.PiecewiseQuadratic(alpha=1.3),
    "PiecewiseExp": lambda: surrogate.PiecewiseExp(alpha=1.5),
    "SquarewaveFourierSeries": lambda: surrogate.SquarewaveFourierSeries(n=3, T_period=6),
    "S2NN": lambda: surrogate.S2NN(alpha=3.0, beta=0.7), "QPseudoSpike": lambda: surrogate.QPseudoSpike(alpha=3.0),
    "LeakyKReLU": lambda: surrogate.LeakyKReLU(leak=0.1, k=0.8),
    "FakeNumericalGradient": lambda: surrogate.FakeNumericalGradient(alpha=0.4),
    "LogTailedReLU": lambda: surrogate.LogTailedReLU(alpha=0.2), "DeterministicPass": surrogate.DeterministicPass,
    "Rect": lambda: surrogate.Rect(alpha=0.8),
}


def _surrogate_core(name: str):
    function = SURROGATES[name]()

    def core(x, v, *, spike=function):  # keyword-only: not an argument FlexSN counts
        h = 0.6 * v + x
        s = spike(h - 1.0)
        return s, h * (1.0 - s)
    return core


@pytest.mark.parametrize("name", ["Sigmoid", "PiecewiseLeakyReLU", "S2NN", "SquarewaveFourierSeries", "Rect"]
                         if profile() != "slow" else list(SURROGATES))
def test_surrogates_match_spikingjelly(name: str) -> None:
    compare(_surrogate_core(name), 1, lambda: (), None, "reference", "m", scale=2.5)


@SLOW
@NEEDS_HOST
@pytest.mark.parametrize("name", list(SURROGATES))
def test_surrogates_match_spikingjelly_on_the_host_runner(name: str) -> None:
    compare(_surrogate_core(name), 1, lambda: (), None, "host", "m", scale=2.5)


# -- SpikingJelly's functional protocol ---------------------------------------------------------------------------
def _pair(step_mode: str = "m"):
    tau = torch.tensor(2.0, dtype=F64)
    return (FlexSN(lif, 1, (tau.clone(),), step_mode=step_mode, backend="reference"),
            sj_flexsn.FlexSN(lif, 1, (tau.clone(),), step_mode=step_mode))


def test_init_states_and_materialize_states_are_spikingjellys() -> None:
    """`FlexSN.init_states` (a static method) and `materialize_states` exist and give SpikingJelly's zeros (the
    old layer had neither: an AttributeError, and the base's `materialize_states` returned the None states)."""
    x = torch.rand(4, 3, N, dtype=F64)
    for step_mode, first in (("m", x), ("s", x[0])):
        expected = sj_flexsn.FlexSN.init_states(2, step_mode, first)
        got = FlexSN.init_states(2, step_mode, first)
        assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, expected))
        ours, theirs = _pair(step_mode)
        assert torch.equal(ours.materialize_states((first,), (None,), step_mode)[0],
                           theirs.materialize_states((first,), (None,), step_mode)[0])
        given = (torch.ones(3, N, dtype=F64),)
        assert ours.materialize_states((first,), given, step_mode) == given
    with pytest.raises(ValueError, match="T >= 1"):
        FlexSN.init_states(1, "m", torch.tensor(1.0))
    with pytest.raises(ValueError, match="expected 1 tensors, got 2"):
        _pair()[0].materialize_states((x,), (None, None), "m")


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_functional_forwards_are_spikingjellys(step_mode: str) -> None:
    """`single_step_functional_forward` / `multi_step_functional_forward(inputs, states, static_inputs=...)`
    return SpikingJelly's `(outputs, new_states)` and gradients, from explicit states and static inputs, and leave
    the layer's own states and state sequences as they were (the old layer raised NotImplementedError)."""
    ours, theirs = _pair(step_mode)
    ours.store_state_seqs = True
    kept = torch.rand(N, dtype=F64)
    ours(torch.rand((3, N) if step_mode == "m" else (N,), dtype=F64))
    ours.states = (kept,)
    seqs = ours.state_seqs
    x = (torch.rand((6, N) if step_mode == "m" else (N,), dtype=F64) * 3).requires_grad_()
    v0 = torch.rand(N, dtype=F64, requires_grad=True)
    tau = torch.tensor(2.5, dtype=F64, requires_grad=True)  # not the layer's static input
    name = f"{'multi' if step_mode == 'm' else 'single'}_step_functional_forward"
    mine = getattr(ours, name)((x,), (v0,), static_inputs=(tau,))
    their = getattr(theirs, name)((x,), (v0,), static_inputs=(tau,))
    for p, q in zip((*mine[0], *mine[1]), (*their[0], *their[1]), strict=True):
        _close(p, q)
    g1 = torch.autograd.grad(_loss(mine[0], mine[1]), (x, v0, tau))
    g2 = torch.autograd.grad(_loss(their[0], their[1]), (x, v0, tau))
    for p, q in zip(g1, g2, strict=True):
        _close(p, q, 1e-10)
    assert ours.states[0] is kept and ours.state_seqs is seqs  # untouched
    # without static_inputs: the layer's (SpikingJelly's requires them); None states start at zeros
    first = getattr(ours, name)((x,), (None,))
    second = getattr(theirs, name)((x,), theirs.materialize_states((x,), (None,), step_mode),
                                   static_inputs=theirs.static_inputs)
    for p, q in zip((*first[0], *first[1]), (*second[0], *second[1]), strict=True):
        _close(p, q)
    with pytest.raises(ValueError, match="static_inputs: expected 1 tensors, got 0"):
        getattr(ours, name)((x,), (v0,), static_inputs=())
    with pytest.raises(ValueError, match="states: expected 1 tensors, got 2"):
        getattr(ours, name)((x,), (v0, v0))


def test_to_functional_forward_runs_the_layer_from_explicit_states() -> None:
    """SpikingJelly's `base.to_functional_forward` (what its memopt checkpointing calls) on our layer alone and in
    an `nn.Sequential`: the layer's own states untouched. (SpikingJelly's own FlexSN fails there: its functional
    forwards require `static_inputs=`.)"""
    ours, theirs = _pair()
    x = torch.rand(6, N, dtype=F64) * 3
    v0 = torch.rand(N, dtype=F64)
    expected = theirs.multi_step_functional_forward((x,), (v0,), static_inputs=theirs.static_inputs)
    got = sj_base.to_functional_forward(ours)((x,), (v0,))
    for p, q in zip((*got[0], *got[1]), (*expected[0], *expected[1]), strict=True):
        _close(p, q)
    assert ours.states == (None,)
    torch.manual_seed(0)
    linear = torch.nn.Linear(N, N, dtype=F64)
    net = torch.nn.Sequential(linear, ours)
    outputs, states = sj_base.to_functional_forward(net)((x,), (v0,))
    reference = theirs.multi_step_functional_forward((linear(x),), (v0,), static_inputs=theirs.static_inputs)
    _close(outputs[0], reference[0][0])
    _close(states[0], reference[1][0])
    assert ours.states == (None,)


def test_extra_repr_of_a_partial_core_is_spikingjellys() -> None:
    """A functools.partial core is shown as SpikingJelly shows it, `partial(<name>)` (it read `partial`)."""
    core = functools.partial(lif, tau=torch.tensor(2.0))
    ours = FlexSN(functools.partial(no_reset), 1)
    theirs = sj_flexsn.FlexSN(functools.partial(no_reset), 1)
    assert ours.extra_repr().startswith(theirs.extra_repr())
    assert "core=partial(no_reset), num_states=1, num_static_inputs=0, step_mode='m'" in repr(ours)
    with pytest.raises(TypeError):  # both refuse a tensor bound by a partial
        sj_flexsn.FlexSN(core, 1)
    with pytest.raises((TypeError, SpecError)):
        FlexSN(core, 1)


# -- attributes, modules, models ----------------------------------------------------------------------------------
def test_attributes_after_building_take_effect_as_in_spikingjelly() -> None:
    """A static input changed in place, replaced (another shape, a Parameter for a buffer), the step mode and
    store_state_seqs changed, reset_net / detach_net / eval: each as SpikingJelly's; core and num_states refused."""
    x = torch.rand(5, N, dtype=F64) * 3
    for change in (lambda m: m._static_input_0.fill_(3.0),
                   lambda m: setattr(m, "_static_input_0", torch.linspace(1.5, 3.0, N, dtype=F64)),
                   lambda m: setattr(m, "_static_input_0", _p(2.5))):
        ours, theirs = _pair()
        ours(x), theirs(x)
        change(ours), change(theirs)
        _close(ours(x), theirs(x))
        _close(ours.states[0], theirs.states[0])
        if isinstance(ours._static_input_0, torch.nn.Parameter):
            g1 = torch.autograd.grad(ours(x).sum() + ours.states[0].sum(), ours._static_input_0)
            g2 = torch.autograd.grad(theirs(x).sum() + theirs.states[0].sum(), theirs._static_input_0)
            _close(g1[0], g2[0], 1e-10)
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.store_state_seqs = True
        layer(x)
        assert layer.state_seqs[0].shape == (5, N)
        sj_functional.set_step_mode(layer, "s")
        assert layer.state_seqs is None
        layer(x[0])
        layer.step_mode = "m"
        layer.store_state_seqs = False
        layer(x.requires_grad_())
        assert layer.state_seqs is None and layer.states[0].requires_grad
        sj_functional.detach_net(layer)
        assert not layer.states[0].requires_grad
    _close(ours.states[0], theirs.states[0])
    sj_functional.reset_net(ours)
    assert ours.states == (None,) and [n for n, _ in ours.named_memories()] == ["_state_0"]
    with pytest.raises(AttributeError, match="core is fixed at construction"):
        ours.core = no_reset
    with pytest.raises(AttributeError, match="num_states is fixed at construction"):
        ours.num_states = 2


def test_spikingjellys_example_core_in_a_model() -> None:
    """SpikingJelly's training example (`examples/train_flexsn_compile.py`) builds its core in a function, with the
    surrogate module in a closure, and sets the step mode of the model: SpikingJelly's FlexSN refuses that closure,
    ours takes it (docs/spikingjelly.md) and equals SpikingJelly's on the same core reading a global surrogate."""

    def make_core(alpha: float):
        sg_local = surrogate.Sigmoid(alpha=alpha)

        def lif_core_sg(x: torch.Tensor, v: torch.Tensor):
            tau, v_th = 2.0, 1.0
            h = v + (x - v) / tau
            s = sg_local(h - v_th)
            return s, h * (1.0 - s)
        return lif_core_sg

    def global_core(x: torch.Tensor, v: torch.Tensor):
        tau, v_th = 2.0, 1.0
        h = v + (x - v) / tau
        s = sg(h - v_th)
        return s, h * (1.0 - s)

    with pytest.raises(TypeError, match="cannot capture"):
        sj_flexsn.FlexSN(core=make_core(4.0), num_states=1, step_mode="m")
    torch.manual_seed(0)
    linear = torch.nn.Linear(N, N, dtype=F64)
    nets = [torch.nn.Sequential(linear, FlexSN(core=make_core(4.0), num_states=1, step_mode="s",
                                               backend="reference")),
            torch.nn.Sequential(linear, sj_flexsn.FlexSN(core=global_core, num_states=1, step_mode="s"))]
    x = (torch.rand(4, 2, N, dtype=F64) * 3).requires_grad_()
    results = []
    for net in nets:
        sj_functional.set_step_mode(net, step_mode="m")
        out = net(x)
        sj_functional.reset_net(net)
        out = out + net(x)
        results.append((out, *torch.autograd.grad(_loss([out], []), (x, linear.weight))))
    for p, q in zip(*results, strict=True):
        _close(p, q, 1e-10)


# -- refusals ------------------------------------------------------------------------------------------------------
def _inplace(x, v):
    h = 0.5 * v
    h += x
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def _python_if(x, v):
    h = 0.5 * v + x
    if h > 0.5:  # one neuron
        h = h * 2.0
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def _unlisted_op(x, v):
    h = 0.5 * v + torch.log1p(x)
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def _varargs(*args):
    return sg(args[0] - 1.0), args[0]


smooth = surrogate.ATan(spiking=False)


def _non_spiking(x, v):
    h = v + x
    s = smooth(h - 1.0)  # SpikingJelly's primitive: in-place operations of its own
    return s, h * (1.0 - s)


@pytest.mark.parametrize("core, message", [
    (_inplace, "in-place"), (_python_if, "torch.where"), (_unlisted_op, "torch.log1p cannot be part"),
    (_varargs, r"\*args"), (_non_spiking, r"surrogate\.ATan\(spiking=False\) \(its primitive uses the in-place")])
def test_cores_spikingjelly_runs_but_kernels_cannot_are_refused_naming_the_problem(core, message: str) -> None:
    """SpikingJelly's torch path runs these on the CPU (but `*args`, which both refuse); ours refuses each at
    construction, naming the problem (docs/python-neurons.md, 'What a step may use')."""
    if core is not _varargs:
        sj_flexsn.FlexSN(core, 1)(torch.rand(3))  # [T]: one neuron
    with pytest.raises(SpecError, match=message):
        FlexSN(core, 1)


def test_argument_checks_against_spikingjellys() -> None:
    """What SpikingJelly refuses at a call, ours refuses too (by name); a switch that is no bool is refused where
    SpikingJelly takes its truth (docs/spikingjelly.md); a static input of another dtype is converted."""
    ours, theirs = _pair()
    x = torch.rand(4, N, dtype=F64)
    for states in ((torch.zeros(3, dtype=F64),), (torch.zeros(N),)):
        for layer in (ours, theirs):
            layer.states = states
            with pytest.raises((ValueError, TypeError)):
                layer(x)
            layer.reset()
    with pytest.raises(ValueError, match="static input 'tau': 3 values"):
        FlexSN(lif, 1, (torch.ones(3, dtype=F64),))(x)
    with pytest.raises(TypeError, match="store_state_seqs"):
        FlexSN(lif, 1, (torch.tensor(2.0),), store_state_seqs="no")
    two = FlexSN(lambda a, b, v: (sg(v + a + b - 1.0), v + a + b), 1)
    with pytest.raises(ValueError, match="every step input must match"):
        two(x, x[:3])
    # SpikingJelly refuses a float32 static input with float64 inputs; ours computes as the core would
    mixed = FlexSN(lif, 1, (torch.tensor(2.0),), backend="reference")(x)
    _close(mixed, theirs.__class__(lif, 1, (torch.tensor(2.0, dtype=F64),))(x))
