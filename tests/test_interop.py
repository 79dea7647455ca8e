"""autocuda layers inside SpikingJelly networks, checked with SpikingJelly's own functions and against its own
layers (runs only where SpikingJelly imports; skipped otherwise)."""
from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.nn import IzhikevichNode, LIFNode, Neuron
from autocuda.spec.model import NeuronSpec

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import functional as sj_functional
    from spikingjelly.activation_based import layer as sj_layer
    from spikingjelly.activation_based import neuron as sj_neuron
    from spikingjelly.activation_based import surrogate as sj_surrogate
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64


def network(step_mode: str) -> nn.Sequential:
    return nn.Sequential(
        sj_layer.Linear(6, 5, step_mode=step_mode),
        LIFNode(tau=2.0, step_mode=step_mode),
        sj_layer.Linear(5, 4, step_mode=step_mode),
        sj_neuron.LIFNode(tau=2.0, step_mode=step_mode),
        sj_layer.Linear(4, 3, step_mode=step_mode),
        IzhikevichNode(step_mode=step_mode),
    )


def pair(name: str, **kwargs) -> tuple[nn.Module, nn.Module]:
    """SpikingJelly's layer and ours, in float64."""
    return getattr(sj_neuron, name)(**kwargs).to(F64), getattr(our, name)(**kwargs).to(F64)


def run(layer: nn.Module, x_seq: torch.Tensor) -> torch.Tensor:
    return layer(x_seq) if layer.step_mode == "m" else torch.stack([layer(x) for x in x_seq])


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_reset_net_resets_our_layers(step_mode: str) -> None:
    torch.manual_seed(0)
    net = network(step_mode)
    ours_lif, ours_izh = net[1], net[5]
    x = 3 * torch.rand(6, 2, 6)
    outputs = [net(x)] if step_mode == "m" else [net(step) for step in x]
    assert isinstance(ours_lif.v, torch.Tensor) and ours_lif.v.shape == (2, 5)
    assert isinstance(ours_izh.w, torch.Tensor)
    sj_functional.reset_net(net)
    assert ours_lif.v == 0.0 and ours_izh.v == 0.0 and ours_izh.w == 0.0
    again = [net(x)] if step_mode == "m" else [net(step) for step in x]
    for a, b in zip(outputs, again):  # the same sequence from the same start gives the same spikes
        assert torch.equal(a, b)


def test_gradients_flow_through_a_mixed_network() -> None:
    torch.manual_seed(1)
    net = network("m")
    net(3 * torch.rand(8, 2, 6)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


# -- 1. truncated BPTT: functional.detach_net -------------------------------------------------------------
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_detach_net_gives_truncated_bptt_as_theirs(step_mode: str) -> None:
    torch.manual_seed(2)

    def build(node: type) -> nn.Sequential:
        torch.manual_seed(3)
        return nn.Sequential(sj_layer.Linear(6, 5, step_mode=step_mode), node(step_mode=step_mode,
                             store_v_seq=True), sj_layer.Linear(5, 3, step_mode=step_mode)).to(F64)

    theirs, mine = build(sj_neuron.LIFNode), build(LIFNode)
    x = 2 * torch.rand(8, 2, 6, dtype=F64)
    for net in (theirs, mine):
        for chunk in x.split(4):  # two chunks; without detach_net the second backward would fail
            run_net = net(chunk) if step_mode == "m" else torch.stack([net(t) for t in chunk])
            run_net.pow(2).sum().backward()
            sj_functional.detach_net(net)
            assert not net[1].v.requires_grad and not net[1].v_seq.requires_grad
    for a, b in zip(theirs.parameters(), mine.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_without_detach_the_second_chunk_fails_as_theirs_does() -> None:
    lif, w = LIFNode(step_mode="m"), torch.ones(3, requires_grad=True)
    lif(torch.rand(4, 3) * w).sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        lif(torch.rand(4, 3) * w).sum().backward()


# -- 2. store_v_seq in step mode 's' ----------------------------------------------------------------------
def test_store_v_seq_single_steps_append_until_reset_as_theirs() -> None:
    torch.manual_seed(4)
    theirs, mine = pair("LIFNode", store_v_seq=True)
    x = 2 * torch.rand(5, 3, 4, dtype=F64)
    run(theirs, x), run(mine, x)
    assert mine.v_seq.shape == (5, 3, 4)
    torch.testing.assert_close(mine.v_seq, theirs.v_seq)
    run(theirs, x[:2, :2]), run(mine, x[:2, :2])  # a new neuron shape starts a new sequence
    torch.testing.assert_close(mine.v_seq, theirs.v_seq)
    mine.reset()
    assert mine.v_seq is None


# -- 3. a new input shape without reset() ------------------------------------------------------------------
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("name", ["LIFNode", "IzhikevichNode", "QIFNode"])
def test_a_new_batch_size_starts_afresh_as_theirs(name: str, step_mode: str) -> None:
    torch.manual_seed(5)
    theirs, mine = pair(name, step_mode=step_mode)
    for batch in (4, 1, 3):  # 1: a batch-1 state is not broadcast over the next batch
        x = 2 * torch.rand(6, batch, 5, dtype=F64)
        assert torch.equal(run(theirs, x), run(mine, x))
        torch.testing.assert_close(mine.v, theirs.v)


def test_a_state_of_another_dtype_follows_the_input() -> None:
    lif = LIFNode(step_mode="m")
    lif(torch.rand(3, 2, 4))
    lif.v = lif.v.to(F64)
    assert lif(torch.rand(3, 2, 4)).dtype == torch.float32 and lif.v.dtype == torch.float32


def test_wrong_states_get_clear_errors() -> None:
    lif = LIFNode(v_reset=torch.zeros(3))  # a broadcast initial value that does not fit [2, 4]
    with pytest.raises(ValueError, match="state 'v'.*'v_reset'.*does not broadcast"):
        lif(torch.rand(2, 4))
    lif = LIFNode()
    lif.v = "zero"
    with pytest.raises(TypeError, match="state 'v'"):
        lif(torch.rand(2, 4))


# -- 4. positional arguments in SpikingJelly 2.0's order ---------------------------------------------------
SJ_CLASSES = ["IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "SimpleIFNode",
              "SimpleLIFNode", "HalfThresholdIFNode", "CUBALIFNode", "KLIFNode", "RAFNode"]


@pytest.mark.parametrize("name", SJ_CLASSES)
def test_signatures_are_theirs_then_backend(name: str) -> None:
    def params(cls: type) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()][1:]

    theirs, mine = params(getattr(sj_neuron, name)), params(getattr(our, name))
    assert mine[-1] == ("backend", None)
    assert [n for n, _ in mine[:-1]] == [n for n, _ in theirs]
    for (n, a), (_, b) in zip(theirs, mine):  # defaults equal (surrogates: the same class and parameters)
        assert (ours.get_surrogate(a) == ours.get_surrogate(b)) if n == "surrogate_function" else a == b, n


def test_positional_call() -> None:
    node = our.IFNode(1., 0., sj_surrogate.ATan(), False, "m", True)
    assert node.step_mode == "m" and node.store_v_seq and not node.detach_reset
    node(torch.rand(3, 2))
    assert node.v_seq.shape == (3, 2)


# -- 5. SpikingJelly's memory protocol ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["LIFNode", "IzhikevichNode", "CUBALIFNode", "RAFNode"])
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_functional_forward_from_explicit_states_as_theirs(name: str, step_mode: str) -> None:
    torch.manual_seed(6)
    theirs, mine = pair(name)
    theirs.step_mode = mine.step_mode = step_mode
    assert [n for n, _ in mine.named_memories()] == [n for n, _ in theirs.named_memories()]
    x = 2 * torch.rand(*((4,) if step_mode == "m" else ()), 3, 5, dtype=F64)
    states = tuple(torch.rand(3, 5, dtype=F64) for _ in theirs.memories())
    before = list(mine.memories())
    first, again, reference = (mine.functional_forward((x,), states), mine.functional_forward((x,), states),
                               theirs.functional_forward((x,), states))
    for a, b, c in zip([*first[0], *first[1]], [*again[0], *again[1]], [*reference[0], *reference[1]]):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c)
    assert list(mine.memories()) == before  # the layer's own states are untouched


def test_memories_reset_values_and_register_memory_as_theirs() -> None:
    theirs, mine = pair("IzhikevichNode", w_rest=0.3, step_mode="m")
    for layer in (theirs, mine):
        layer(torch.rand(3, 2, dtype=F64))
        layer.register_memory("trace", 0.5)  # (their Izhikevich runs no more after this: it returns 2 states)
        assert layer.get_reset_value("w") == 0.3 and layer.get_reset_value("trace") == 0.5
    assert [n for n, _ in mine.named_memories()] == [n for n, _ in theirs.named_memories()] == ["v", "w", "trace"]
    mine.trace = torch.ones(2)
    mine.set_reset_value("v", -0.2)
    mine.reset()
    assert mine.v == -0.2 and mine.w == 0.3 and mine.trace == 0.5
    with pytest.raises(ValueError, match="register_memory"):
        mine.register_memory("v", 0.0)
    with pytest.raises(KeyError, match="not a memory"):
        mine.get_reset_value("tau")


def test_set_step_mode_and_module_to_as_theirs() -> None:
    net = network("s")
    sj_functional.set_step_mode(net, "m")
    assert net[1].step_mode == "m" and net[5].step_mode == "m"
    net(torch.rand(3, 2, 6))
    net.to(F64)
    assert net[1].v.dtype == F64  # memories move with the module, as SpikingJelly's


# -- 6. a spec's own surrogate -------------------------------------------------------------------------------
def test_neuron_takes_the_specs_surrogate_by_default() -> None:
    spec = NeuronSpec(name="if_atan", charge="v + x", params={"v_threshold": 1.0, "v_reset": 0.0},
                      states={"v": "v_reset"}, surrogate=ours.ATan(alpha=3.0))
    assert Neuron(spec)._surrogate == ours.ATan(alpha=3.0)
    assert Neuron(spec, surrogate_function=ours.Erf())._surrogate == ours.Erf()
    assert our.CUBALIFNode()._surrogate == ours.Rect()  # SpikingJelly's default for this class
    assert our.IFNode()._surrogate == ours.Sigmoid(alpha=4.0)  # SpikingJelly's classes keep its default


# -- surrogates ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("theirs", "expected"), [
    (sj_surrogate.ATan(), ours.ATan(alpha=2.0)),
    (sj_surrogate.ATan(alpha=3.0), ours.ATan(alpha=3.0)),
    (sj_surrogate.Sigmoid(alpha=5.0), ours.Sigmoid(alpha=5.0)),
    (sj_surrogate.Erf(), ours.Erf(alpha=2.0)),
    (sj_surrogate.PiecewiseLeakyReLU(w=0.5, c=0.02), ours.PiecewiseLeakyReLU(w=0.5, c=0.02)),
    (sj_surrogate.Rect(alpha=0.7), ours.Rect(alpha=0.7)),
    (sj_surrogate.SquarewaveFourierSeries(n=4, T_period=6.0), ours.SquarewaveFourierSeries(n=4, T_period=6.0)),
    (sj_surrogate.DeterministicPass(), ours.DeterministicPass()),
])
def test_their_surrogate_objects_are_accepted(theirs, expected) -> None:
    assert ours.get_surrogate(theirs) == expected
    lif = LIFNode(surrogate_function=theirs, step_mode="m")
    x = (2 * torch.rand(5, 7)).requires_grad_(True)
    lif(x).sum().backward()
    reference = LIFNode(surrogate_function=expected, step_mode="m")
    y = x.detach().clone().requires_grad_(True)
    reference(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("surrogate", [sj_surrogate.Rect(alpha=0.8), sj_surrogate.SquarewaveFourierSeries(n=3),
                                       sj_surrogate.DeterministicPass(), sj_surrogate.ATan()])
@pytest.mark.parametrize("spiking", [True, False])
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_surrogates_and_non_spiking_mode_as_theirs(surrogate, spiking: bool, step_mode: str) -> None:
    torch.manual_seed(7)
    surrogate.set_spiking_mode(spiking)
    theirs = sj_neuron.LIFNode(surrogate_function=surrogate, step_mode=step_mode).to(F64)
    mine = LIFNode(surrogate_function=surrogate, step_mode=step_mode, backend="torch").to(F64)
    x = (2 * torch.rand(6, 3, 4, dtype=F64) - 0.5).requires_grad_(True)
    y = x.detach().clone().requires_grad_(True)
    a, b = run(theirs, x), run(mine, y)
    torch.testing.assert_close(a, b)
    a.pow(2).sum().backward(), b.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_non_spiking_mode_is_refused_on_kernel_backends() -> None:
    lif = LIFNode(surrogate_function=sj_surrogate.ATan(spiking=False), backend="host")
    with pytest.raises(ValueError, match="reference"):
        lif(torch.rand(2, 3))


def test_same_spikes_as_their_lif() -> None:
    torch.manual_seed(2)
    x = 2 * torch.rand(10, 3, 8)
    theirs = sj_neuron.LIFNode(tau=2.0, step_mode="m", surrogate_function=sj_surrogate.ATan())
    mine = LIFNode(tau=2.0, step_mode="m", surrogate_function=sj_surrogate.ATan())
    assert torch.equal(theirs(x), mine(x))
    torch.testing.assert_close(theirs.v, mine.v)


# -- more of SpikingJelly's classes ----------------------------------------------------------------------------
MORE = [("SimpleIFNode", {}), ("SimpleLIFNode", {"tau": 2.0, "decay_input": True}),
        ("SimpleLIFNode", {"tau": 3.0, "decay_input": False, "v_reset": -0.1}), ("HalfThresholdIFNode", {}),
        ("CUBALIFNode", {}), ("CUBALIFNode", {"v_reset": None, "c_decay": 0.3}), ("KLIFNode", {}),
        ("KLIFNode", {"v_reset": None, "decay_input": False}), ("RAFNode", {}),
        ("RAFNode", {"b": -0.5, "omega": 2.0, "dt": 0.5}), ("IzhikevichNode", {"a": 0.5, "b": 0.2}),
        ("ParametricLIFNode", {"init_tau": 3.0})]


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize(("name", "kwargs"), MORE, ids=[f"{n}{k}" for n, k in MORE])
def test_same_spikes_states_and_gradients_as_theirs(name: str, kwargs: dict, step_mode: str) -> None:
    torch.manual_seed(8)
    theirs, mine = pair(name, **kwargs)
    theirs.step_mode = mine.step_mode = step_mode
    x = (1.5 * torch.randn(6, 3, 4, dtype=F64)).requires_grad_(True)
    y = x.detach().clone().requires_grad_(True)
    for _ in range(2):  # two calls: the states carry over
        a, b = run(theirs, x), run(mine, y)
        assert torch.equal(a, b)
    for (n, s), (_, t) in zip(theirs.named_memories(), mine.named_memories()):
        torch.testing.assert_close(s, t, msg=n)
    weights = torch.arange(a.numel(), dtype=F64).view_as(a)
    (a * weights).sum().backward(), (b * weights).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    for (n, p), (_, q) in zip(theirs.named_parameters(), mine.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


@pytest.mark.parametrize(("build", "argument"), [
    (lambda: our.LIFNode(tau=1.0), "tau"), (lambda: our.ParametricLIFNode(init_tau=0.5), "init_tau"),
    (lambda: our.QIFNode(v_threshold=-0.2), "v_threshold"), (lambda: our.QIFNode(a0=0.0), "a0"),
    (lambda: our.EIFNode(delta_T=0.0), "delta_T"), (lambda: our.EIFNode(v_rest=-1.0), "v_rest"),
    (lambda: our.IzhikevichNode(tau=0.9), "tau"), (lambda: our.KLIFNode(tau=1.0), "tau"),
    (lambda: our.KLIFNode(scale_reset=True), "scale_reset"), (lambda: our.RAFNode(b=0.1), "b"),
    (lambda: our.RAFNode(omega=0.0), "omega"), (lambda: our.RAFNode(dt=-1.0), "dt"),
    (lambda: our.HalfThresholdIFNode(v_threshold=0.0), "v_threshold"),
    (lambda: our.SimpleLIFNode(2.0, True, v_reset=None), "v_reset"),
])
def test_bad_arguments_are_refused_naming_them(build, argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}:"):
        build()


@pytest.mark.parametrize(("build", "argument"), [
    (lambda: our.IFNode(detach_reset="yes"), "detach_reset"), (lambda: our.LIFNode(store_v_seq=1), "store_v_seq"),
    (lambda: our.IFNode(v_threshold="1"), "v_threshold"), (lambda: our.IFNode(v_threshold=None), "v_threshold"),
    (lambda: our.HalfThresholdIFNode(v_threshold="1"), "v_threshold"),
])
def test_bad_argument_types_are_refused_naming_them(build, argument: str) -> None:
    with pytest.raises(TypeError, match=f"^{argument}:"):
        build()


# -- 5b. SpikingJelly's free functions see our layers as its MemoryModules ---------------------------------------
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_to_functional_forward_and_extract_memories_on_our_layers_as_theirs(step_mode: str) -> None:
    from spikingjelly.activation_based import base

    def net(kind):
        torch.manual_seed(4)
        return nn.Sequential(sj_layer.Linear(5, 5, step_mode=step_mode), kind.LIFNode(step_mode=step_mode),
                             sj_layer.Linear(5, 5, step_mode=step_mode),
                             kind.IzhikevichNode(step_mode=step_mode)).to(F64)

    theirs, mine = net(sj_neuron), net(our)
    assert isinstance(mine[1], base.MemoryModule) and isinstance(mine[3], base.MemoryModule)
    assert [n for n, _ in base.named_memories(mine)] == [n for n, _ in base.named_memories(theirs)]
    x = 2 * torch.rand(*((4,) if step_mode == "m" else ()), 3, 5, dtype=F64)
    states = tuple(torch.rand(3, 5, dtype=F64) for _ in base.extract_memories(theirs))
    before = base.extract_memories(mine)
    (a,), new_a = base.to_functional_forward(theirs)((x,), states)
    (b,), new_b = base.to_functional_forward(mine)((x,), states)
    assert torch.equal(a, b)
    for s, t in zip(new_a, new_b):
        torch.testing.assert_close(t, s)
    assert base.extract_memories(mine) == before  # the layers' own states are untouched
