"""`detach()` cuts the states' graphs in place (SpikingJelly's `detach_()`), on every path of the kernels: a state
tensor held from before `functional.detach_net` loses its graph too. The kernels write the final states into
tensors of the neuron shape, never views of flat outputs (which torch cannot detach in place), for inputs of any
number of neuron dims, through the unbound Python path, a program's bound launch and the native keyed call, in single
steps and sequences, with and without grad, for every state of a multi-state neuron and for FlexSN; detaching
changes no value of the next chunk."""
from __future__ import annotations

import functools

import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.call import native, program

functional = pytest.importorskip("spikingjelly.activation_based.functional")

pytestmark = NEEDS_HOST
# [T, B, N] and [T, B, C, H, W], of one T: both run the same kernels (a T below a replay segment compiles kernels
# replaying T steps, a pair per T).
SHAPES = [(4, 3, 4), (4, 2, 3, 2, 2)]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels the layers below launch, compiled up front many to a compiler run (`conftest.compile_launched`):
    the same kernels on every call path."""
    def calls(kind: str, mode: str, shape: tuple[int, ...], grad: bool) -> None:
        layer = LAYERS[kind](mode).to(torch.float64)
        for seed in (0, 1):  # from the initial states (numbers), then from those kept (tensors)
            out = run(layer, chunk(seed, shape, grad), mode)
            if grad:
                out.sum().backward()
            functional.detach_net(layer)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "USE", False)
        return compile_launched(*(functools.partial(calls, kind, mode, shape, grad) for kind in LAYERS
                                  for mode in ("m", "s") for shape in SHAPES for grad in (True, False)))


@pytest.fixture(params=["python", "native", "full"])
def path(request, monkeypatch):
    """The call path: the program's bound Python launch, the native operator (the program's, also for the
    keyed call), or the full path (nothing bound)."""
    if request.param == "native":
        request.getfixturevalue("native_on_host")  # host calls through the native operator (conftest)
    else:
        monkeypatch.setattr(native, "USE", False)
    monkeypatch.setattr(program, "ENABLED", request.param != "full")
    return request.param


def chunk(seed: int, shape: tuple[int, ...], grad: bool) -> torch.Tensor:
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    return x.requires_grad_(grad)


def sigmoid_lif(x: torch.Tensor, v: torch.Tensor):
    h = v + (x - v) / 2.0
    s = SIGMOID(h - 1.0)
    return s, h * (1.0 - s)


SIGMOID = ours.Sigmoid()
LAYERS = {
    "lif": lambda mode: our.LIFNode(step_mode=mode, backend="host"),
    "izhikevich": lambda mode: our.IzhikevichNode(step_mode=mode, backend="host"),
    "flexsn": lambda mode: our.FlexSN(sigmoid_lif, 1, step_mode=mode, backend="host"),
}


def memories(layer: torch.nn.Module) -> list[torch.Tensor]:
    return [value for _, value in layer.named_memories()] if hasattr(layer, "named_memories") else []


def run(layer: torch.nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "m":
        return layer(x)
    return torch.stack([layer(step) for step in x])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["m", "s"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_detach_net_cuts_the_graph_of_states_held_from_before(kind, grad, mode, shape, path):
    layer, twin = LAYERS[kind](mode), LAYERS[kind](mode)
    layer.to(torch.float64), twin.to(torch.float64)
    for _ in range(3):  # the same call again: the program's bound launch, then the keyed call
        functional.reset_net(layer), functional.reset_net(twin)
        first = chunk(0, shape, grad)
        run(layer, first, mode), run(twin, first, mode)
    held = memories(layer)
    assert held and all(h.shape == shape[1:] for h in held), "every state is a tensor of the neuron shape"
    assert all(not h._is_view() for h in held), "a final state is no view (a view cannot be detached in place)"
    if grad:
        assert all(h.grad_fn is not None for h in held)
    values = [h.clone() for h in held]
    functional.detach_net(layer)
    for h, value in zip(held, values):
        assert h.grad_fn is None and not h.requires_grad, "the state held from before lost its graph"
        torch.testing.assert_close(h, value, rtol=0, atol=0)
    assert all(a is b for a, b in zip(memories(layer), held)), "detached in place: the same tensors"
    second = chunk(1, shape, grad)
    out, want = run(layer, second, mode), run(twin, second, mode)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for got, expected in zip(memories(layer), memories(twin)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if grad:
        out.sum().backward()  # the next chunk's backward stops at the detached states
        assert second.grad is not None


def assert_detached_in_place(layer: torch.nn.Module, held: list[torch.Tensor]) -> None:
    assert held and all(h.grad_fn is not None and not h._is_view() for h in held)
    values = [h.clone() for h in held]
    functional.detach_net(layer)
    for h, value in zip(held, values):
        assert h.grad_fn is None and not h.requires_grad
        torch.testing.assert_close(h, value, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["lif", "izhikevich"])
def test_a_t_shaped_input_keeps_states_it_can_detach_in_place(kind, path):
    """Step mode 'm' on x [T] (one neuron, states of shape [] as SpikingJelly's)."""
    layer = LAYERS[kind]("m").to(torch.float64)
    for _ in range(2):
        functional.reset_net(layer)
        layer(chunk(0, (4,), True))  # the T of SHAPES: their kernels
    held = memories(layer)
    assert all(h.shape == () for h in held)
    assert_detached_in_place(layer, held)


@pytest.mark.parametrize("mode", ["m", "s"])
def test_a_fused_batchnorm_neurons_states_are_detached_in_place(mode):
    """`BatchNormNeuron`: its two-pass training call ('m') and its neuron's call ('s')."""
    layer = our.BatchNormNeuron(4, our.LIFNode(step_mode=mode, backend="host"), dtype=torch.float64)
    run(layer, chunk(0, (3, 2, 4, 3, 3), True), mode)
    assert_detached_in_place(layer, memories(layer.neuron))
