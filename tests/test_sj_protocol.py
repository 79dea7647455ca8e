"""SpikingJelly's protocol on our layers, in float64 against SpikingJelly 2.0's own classes: what SpikingJelly reads
at every call (parameters made learnable after warm-up, `surrogate_function` and its parameters and spiking mode,
`decay_input`) is read at the next call here too, on every path (the keyed call, a program's bound launch,
single steps, the reference); FlexSN follows the memory protocol (`detach_net`, `Module.to`, `extract_memories`); the
non-spiking surrogates' gradients, `store_v_seq`, `detach()`, a [T]-shaped input and ILIFNode's threshold behave
as SpikingJelly's (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import pytest
import torch
from backends import CPU_BACKENDS
from torch import nn

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.call import native
from autocuda.nn.neuron import SIGMOID as SHARED_DEFAULT
from autocuda.nn.spikingjelly_levels import MultiLevelSpikeCount

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import base, functional
    from spikingjelly.activation_based import neuron as sj
    from spikingjelly.activation_based import surrogate as sj_sg
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

# Host calls through the native path, as CUDA calls take it by default: the warm-ups below keep keys (conftest)
pytestmark = pytest.mark.usefixtures("native_on_host")
F64 = torch.float64


def inputs(seed: int = 0, shape: tuple[int, ...] = (6, 3, 4)) -> torch.Tensor:
    torch.manual_seed(seed)
    return 1.5 * torch.randn(*shape, dtype=F64)


def warmed(layer: nn.Module, x: torch.Tensor) -> nn.Module:
    """Three calls from a reset: the layer keeps its configuration's part of the key (the host backend), and the
    next call from a reset finds its program by it unless something it was worked out from changed."""
    for _ in range(3):
        layer.reset()
        layer(x.detach().clone())
    layer.reset()
    return layer


def outcome(layer: nn.Module, x: torch.Tensor, step_mode: str = "m") -> list[torch.Tensor]:
    """Output, final membrane and x's gradient of a call from a reset (x's steps one by one in step mode 's')."""
    layer.reset()
    x = x.detach().clone().requires_grad_(True)
    out = layer(x) if step_mode == "m" else torch.stack([layer(step) for step in x])
    weights = torch.linspace(0.5, 1.5, out.numel(), dtype=F64).view(out.shape)
    (out * weights).sum().backward()
    return [out.detach(), layer.v.detach(), x.grad]


def assert_as_theirs(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    for got, want in zip(mine, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


# -- parameters made learnable after warm-up ------------------------------------------------------------
def make_learnable(layer: nn.Module, how: str) -> torch.Tensor:
    """tau made a learned tensor (a buffer for 'register_buffer') the way `how` names."""
    value = torch.tensor(3.0, dtype=F64)
    if how == "Parameter":
        layer.tau = nn.Parameter(value)
    elif how == "register_parameter":
        del layer.tau
        layer.register_parameter("tau", nn.Parameter(value))
    elif how == "register_buffer":
        del layer.tau
        layer.register_buffer("tau", value)
    else:  # a tensor parameter (a buffer) that starts to need its gradient
        layer.tau.copy_(value)
        layer.tau.requires_grad_()
    return layer.tau


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("how", ["Parameter", "register_parameter", "register_buffer", "requires_grad_"])
def test_a_parameter_made_learnable_after_warm_up(how: str, backend: str) -> None:
    x = inputs()
    tau = torch.tensor(2.0, dtype=F64) if how == "requires_grad_" else 2.0
    mine = warmed(our.LIFNode(tau=tau, step_mode="m", backend=backend), x)
    learned = make_learnable(mine, how)
    theirs = sj.LIFNode(tau=2.0, step_mode="m")
    theirs.tau = nn.Parameter(torch.tensor(3.0, dtype=F64)) if how != "register_buffer" else 3.0
    assert_as_theirs(outcome(mine, x), outcome(theirs, x))
    if how != "register_buffer":
        torch.testing.assert_close(learned.grad, theirs.tau.grad, rtol=1e-11, atol=1e-11)


# -- what SpikingJelly reads at every call --------------------------------------------------------------
def sj_atan_after_warm_up(mine: nn.Module, theirs: nn.Module) -> None:
    mine.surrogate_function, theirs.surrogate_function = ours.ATan(alpha=5.0), sj_sg.ATan(alpha=5.0)


def their_object_changed(mine: nn.Module, theirs: nn.Module) -> None:
    mine.surrogate_function.alpha = 5.0  # SpikingJelly's object, passed in
    theirs.surrogate_function.alpha = 5.0


def our_object_changed(mine: nn.Module, theirs: nn.Module) -> None:
    mine.surrogate_function.alpha = 5.0  # ours, passed in
    theirs.surrogate_function.alpha = 5.0


def decay_input_off(mine: nn.Module, theirs: nn.Module) -> None:
    mine.decay_input = theirs.decay_input = False


# change -> (our layer's surrogate_function at construction, SpikingJelly's, the change)
CHANGES = {
    "surrogate_function assigned": (None, None, sj_atan_after_warm_up),
    "SpikingJelly's surrogate's alpha": ("sj", "sj", their_object_changed),
    "our surrogate's alpha": ("ours", "sj", our_object_changed),
    "decay_input": (None, None, decay_input_off),
}


def surrogate(kind: str | None) -> object:
    return {None: sj_sg.Sigmoid(), "sj": sj_sg.ATan(alpha=2.0), "ours": ours.ATan(alpha=2.0)}[kind]


@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_warm_up_is_read_at_the_next_call(change: str, backend: str, step_mode: str) -> None:
    x = inputs(1)
    mine_sg, their_sg, make = CHANGES[change]
    mine = our.LIFNode(surrogate_function=ours.Sigmoid() if mine_sg is None else surrogate(mine_sg),
                       step_mode=step_mode, backend=backend)
    theirs = sj.LIFNode(surrogate_function=surrogate(their_sg), step_mode=step_mode)
    warmed(mine, x if step_mode == "m" else x[0])
    make(mine, theirs)
    for _ in range(2):  # the call after the change, then the keyed call or program it made
        assert_as_theirs(outcome(mine, x, step_mode), outcome(theirs, x, step_mode))


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_set_spiking_mode_on_the_default_surrogate(step_mode: str) -> None:
    """SpikingJelly's non-spiking mode (the primitive in forward) on the torch reference, as its torch backend;
    the kernels' forward is the step, so their next call names the reference instead of running the old one."""
    x = inputs(2)
    mine = warmed(our.LIFNode(step_mode=step_mode, backend="torch"), x if step_mode == "m" else x[0])
    theirs = sj.LIFNode(surrogate_function=sj_sg.Sigmoid(), step_mode=step_mode)
    mine.surrogate_function.set_spiking_mode(False)
    theirs.surrogate_function.set_spiking_mode(False)
    assert_as_theirs(outcome(mine, x, step_mode), outcome(theirs, x, step_mode))
    mine.surrogate_function.set_spiking_mode(True)
    theirs.surrogate_function.set_spiking_mode(True)
    assert_as_theirs(outcome(mine, x, step_mode), outcome(theirs, x, step_mode))


@pytest.mark.parametrize("backend", CPU_BACKENDS[1:])
def test_set_spiking_mode_on_the_kernels_is_refused_at_the_next_call(backend: str) -> None:
    x = inputs(2)
    mine = warmed(our.LIFNode(step_mode="m", backend=backend), x)
    mine.surrogate_function.set_spiking_mode(False)
    with pytest.raises(ValueError, match="reference only"):
        mine(x)


def test_each_layer_changes_its_own_default_surrogate() -> None:
    """SpikingJelly's nodes share one default object (a change of one node's changes all); ours are the layers'."""
    first, second = our.LIFNode(), our.LIFNode()
    assert first.surrogate_function is not second.surrogate_function
    first.surrogate_function.set_spiking_mode(False)
    assert not first.surrogate_function.spiking and second.surrogate_function.spiking
    assert our.LIFNode().surrogate_function.spiking
    with pytest.raises(AttributeError, match="frozen"):  # the shared default itself cannot be changed
        SHARED_DEFAULT.set_spiking_mode(False)


def test_a_replaced_surrogate_no_longer_changes_the_layer() -> None:
    """Our surrogates tell their layers of a change at once (nothing is compared per call); a layer whose
    surrogate_function was replaced no longer listens to the old object."""
    old = ours.ATan(alpha=2.0)
    layer = our.LIFNode(surrogate_function=old)
    layer.surrogate_function = ours.Erf()
    old.alpha = 5.0
    assert layer._surrogate == ours.Erf()
    layer.surrogate_function.alpha = 3.0
    assert layer._surrogate == ours.Erf(alpha=3.0)


# -- FlexSN's memory protocol ---------------------------------------------------------------------------
SIGMOID = ours.Sigmoid()


def lif_core(x: torch.Tensor, v: torch.Tensor):
    h = v + (x - v) / 2.0
    s = SIGMOID(h - 1.0)
    return s, h * (1.0 - s)


def test_flexsn_follows_the_memory_protocol() -> None:
    n = our.FlexSN(lif_core, 1)
    assert isinstance(n, base.MemoryModule)
    x = inputs(3).float().requires_grad_(True)
    n(x).sum().backward()
    held = n._state_0
    assert held.grad_fn is not None
    functional.detach_net(n)
    assert held.grad_fn is None, "detach() cuts the graph of the state held from before (in place)"
    n(x).sum().backward()  # the next chunk's backward: not through the first chunk's graph
    assert [m.shape for m in base.extract_memories(n)] == [x.shape[1:]]
    n.to(F64)
    assert n._state_0.dtype == F64 and n(x.detach().double()).dtype == F64
    functional.reset_net(n)
    assert base.extract_memories(n) == [None]


# -- non-spiking surrogates ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "kwargs"), [("QPseudoSpike", {"alpha": 2.0}), ("QPseudoSpike", {"alpha": 3.5}),
                                              ("S2NN", {"alpha": 4.0, "beta": 1.0}),
                                              ("S2NN", {"alpha": 2.0, "beta": 0.5})])
def test_non_spiking_surrogates_as_theirs(name: str, kwargs: dict) -> None:
    """The primitive and its gradient, far from 0 too (QPseudoSpike's was NaN beyond (alpha - 1) / 2; S2NN's log
    holds SpikingJelly's + 1e-5)."""
    points = torch.cat([torch.linspace(-6, 6, 49, dtype=F64), torch.tensor([0.0, -1.0, -0.25, 0.25], dtype=F64)])
    values = []
    for made in (getattr(ours, name)(spiking=False, **kwargs), getattr(sj_sg, name)(spiking=False, **kwargs)):
        x = points.clone().requires_grad_(True)
        y = made(x)
        y.sum().backward()
        values.append((y.detach(), x.grad))
    assert torch.isfinite(values[0][1]).all()
    for got, want in zip(*values, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# -- store_v_seq, detach, a [T] input, ILIFNode's threshold ----------------------------------------------
def test_store_v_seq_off_drops_the_kept_sequence() -> None:
    mine, theirs = our.LIFNode(step_mode="m", store_v_seq=True), sj.LIFNode(step_mode="m", store_v_seq=True)
    x = inputs(4)
    mine(x), theirs(x)
    assert mine.v_seq is not None and theirs.v_seq is not None
    mine.store_v_seq = theirs.store_v_seq = False
    assert mine.v_seq is None and theirs.v_seq is None


@pytest.mark.parametrize(("backend", "shape"), [("reference", (6, 3, 4)), *[
    pytest.param(backend, shape, marks=p.marks) for p in CPU_BACKENDS[1:] for backend in p.values
    for shape in ((6, 12), (6, 3, 4))]])
def test_detach_cuts_the_graph_of_a_state_held_from_before(backend: str, shape: tuple[int, ...]) -> None:
    """In place, as SpikingJelly's `detach_()` (every path of the kernels: tests/test_detach_in_place.py)."""
    layer = our.LIFNode(step_mode="m", backend=backend)
    layer(inputs(5, shape).requires_grad_(True))
    held = layer.v
    assert held.grad_fn is not None
    functional.detach_net(layer)
    assert held.grad_fn is None and not held.requires_grad and layer.v is held


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_detach_cuts_the_graph_of_the_layers_state(backend: str) -> None:
    layer = our.LIFNode(step_mode="m", backend=backend)
    layer(inputs(5).requires_grad_(True))
    functional.detach_net(layer)
    assert layer.v.grad_fn is None and not layer.v.requires_grad


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_t_shaped_input_in_step_mode_m_is_one_neuron(backend: str) -> None:
    x = inputs(6, (7,))
    mine = our.LIFNode(step_mode="m", backend=backend, store_v_seq=True)
    theirs = sj.LIFNode(step_mode="m", store_v_seq=True)
    for _ in range(2):  # the second call goes on from the first's state (of shape [])
        a, b = mine(x), theirs(x)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert a.shape == (7,) and mine.v.shape == theirs.v.shape == ()
        torch.testing.assert_close(mine.v, theirs.v, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(mine.v_seq, theirs.v_seq, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_v_reset_set_later_is_where_a_reset_starts_v(backend: str) -> None:
    """A deliberate difference (docs/spikingjelly.md): our reset reads v_reset, so the layer computes what one built
    with the new value does; SpikingJelly's reset restores the value its layer was built with."""
    x = inputs(3)
    mine, theirs = our.LIFNode(step_mode="m", backend=backend), sj.LIFNode(step_mode="m")
    for layer in (mine, theirs):
        layer.v_reset = 0.5
        layer.reset()
    assert mine.v == 0.5 and theirs.v == 0.0
    assert_as_theirs(outcome(mine, x), outcome(sj.LIFNode(step_mode="m", v_reset=0.5), x))


def test_ilif_takes_any_threshold_at_construction() -> None:
    """As SpikingJelly's (whose calls then give NaN at 0); a call names the threshold's domain."""
    for threshold in (0.0, -1.0):
        layer = our.ILIFNode(v_threshold=threshold, step_mode="m")
        sj.ILIFNode(v_threshold=threshold)
        with pytest.raises(ValueError, match="v_threshold"):
            layer(inputs(7))
        layer.v_threshold = 1.0
        assert layer(inputs(7)).shape == (6, 3, 4)


def test_ilif_reads_a_new_spike_count() -> None:
    x = inputs(8)
    mine = our.ILIFNode(step_mode="m")
    theirs = sj.ILIFNode(step_mode="m")
    mine(x)
    mine.surrogate_function = MultiLevelSpikeCount(2)
    theirs.surrogate_function = sj_sg.MultiLevelSpikeCount(2)
    assert_as_theirs(outcome(mine, x), outcome(theirs, x))


def test_the_keyed_call_ran_in_these_tests() -> None:
    """The host backend's warm-up above keeps a layer's configuration, and its program runs the native operator
    where it is loaded and asked for on host (else the program's bound launch): say which."""
    layer = warmed(our.LIFNode(step_mode="m", backend="host"), inputs())
    assert layer._programs.configured is not None
    planned = any(p.native is not None for p in layer._programs.values())
    assert planned == (native.HOST and native.status() == "loaded")


def test_more_attributes_read_at_every_call() -> None:
    """RAFNode's dt and LIAFNode's threshold_related (single steps: SpikingJelly's LIAFNode in step mode 'm'
    returns spikes, docs/spikingjelly.md) after warm-up, as SpikingJelly's; KLIFNode's scale_reset=True refused."""
    x = inputs(9)
    mine, theirs = our.RAFNode(step_mode="m"), sj.RAFNode(step_mode="m")
    mine(x)
    mine.dt = theirs.dt = 0.5
    assert_as_theirs(outcome(mine, x), outcome(theirs, x))
    mine = our.LIAFNode(nn.ReLU(), threshold_related=True)
    theirs = sj.LIAFNode(nn.ReLU(), threshold_related=True)
    mine(x[0])
    mine.threshold_related = theirs.threshold_related = False
    assert_as_theirs(outcome(mine, x, "s"), outcome(theirs, x, "s"))
    klif = our.KLIFNode()
    with pytest.raises(ValueError, match="scale_reset"):
        klif.scale_reset = True
    klif.scale_reset = False
