"""SpikingJelly's multi-level spiking neurons (autocuda.nn.spikingjelly_levels), in float64 on the CPU against
SpikingJelly's own classes, on the reference and on the generated kernels (host runner): equal spikes, states and
gradients within rounding; their signatures and argument checks (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import functools
import inspect

import pytest
import torch
from backends import CPU_BACKENDS
from conftest import compile_launched

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.nn.spikingjelly_levels import MultiLevelSpikeCount, ilif_spec
from autocuda.spec.load import load_spec
from autocuda.toolchain.host import cxx as toolchain

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import neuron as sj_neuron
    from spikingjelly.activation_based import surrogate as sj_surrogate
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
BACKENDS = CPU_BACKENDS
CASES = [
    ("TernaryIFNode", {}),
    ("TernaryIFNode", {"v_reset": None}),
    ("TernaryIFNode", {"v_threshold": 0.8, "v_reset": 0.3, "detach_reset": True}),
    ("TernaryIFNode", {"surrogate_function": "ATan"}),
    ("TernaryLIFNode", {"tau": 3.0}),
    ("TernaryLIFNode", {"tau": 3.0, "decay_input": False, "v_reset": None, "detach_reset": True}),
    ("ILIFNode", {}),
    ("ILIFNode", {"tau": 2.0, "v_threshold": 0.7, "detach_reset": True}),
    ("ILIFNode", {"surrogate_function": (3, (-0.7, 2.5))}),
    ("ILIFNode", {"surrogate_function": (2, (0.5, 0.5))}),
]


def _both(kwargs: dict) -> tuple[dict, dict]:
    """SpikingJelly's arguments and ours (the same surrogate objects, built from each library)."""
    theirs, mine = dict(kwargs), dict(kwargs)
    surrogate = kwargs.get("surrogate_function")
    if surrogate == "ATan":
        theirs["surrogate_function"], mine["surrogate_function"] = sj_surrogate.ATan(), ours.ATan()
    elif isinstance(surrogate, tuple):
        count, window = surrogate
        theirs["surrogate_function"] = sj_surrogate.MultiLevelSpikeCount(count, grad_window=window)
        mine["surrogate_function"] = MultiLevelSpikeCount(count, grad_window=window)
    return theirs, mine


def run(layer: torch.nn.Module, x_seq: torch.Tensor, step_mode: str) -> torch.Tensor:
    return layer(x_seq) if step_mode == "m" else torch.stack([layer(x) for x in x_seq])


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the cases below, compiled up front many to a compiler run (`conftest.compile_launched`):
    each test would compile its own in a compiler run of their own."""
    if toolchain.missing() is not None:
        return 0

    def calls(name: str, kwargs: dict, step_mode: str) -> None:
        mine = getattr(our, name)(step_mode=step_mode, backend="host", **_both(kwargs)[1])
        x = torch.randn(8, 3, 5, dtype=F64).requires_grad_(True)
        (run(mine, x, step_mode).sum() + (mine.v ** 2).sum()).backward()

    return compile_launched(*(functools.partial(calls, name, kwargs, step_mode) for name, kwargs in CASES
                              for step_mode in ("s", "m")))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_multi_level_nodes_as_theirs(name: str, kwargs: dict, step_mode: str, backend: str) -> None:
    theirs_kwargs, mine_kwargs = _both(kwargs)
    theirs = getattr(sj_neuron, name)(step_mode=step_mode, **theirs_kwargs)
    mine = getattr(our, name)(step_mode=step_mode, backend=backend, **mine_kwargs)
    torch.manual_seed(3)
    x = (2.5 * torch.randn(8, 3, 5, dtype=F64)).requires_grad_(True)
    x.data[:, 0, 0] = 0.0  # h = 0 exactly: the edge of ILIF's gradient window, which it includes
    y = x.detach().clone().requires_grad_(True)
    a, b = run(theirs, x, step_mode), run(mine, y, step_mode)
    assert torch.equal(a, b)
    assert len(set(a.unique().tolist())) > 2  # more than two levels were reached
    torch.testing.assert_close(mine.v, theirs.v, rtol=1e-13, atol=1e-13)
    weights = torch.randn_like(a)
    ((a * weights).sum() + (theirs.v ** 2).sum()).backward()
    ((b * weights).sum() + (mine.v ** 2).sum()).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)


def test_ilif_counts_round_halves_up_where_spikingjelly_rounds_to_even() -> None:
    """The one difference: at h / v_threshold = k + 1/2 our level k + 1 fires (Θ(0) = 1); torch.round gives
    the even neighbour."""
    x = torch.tensor([[0.5, 1.5, 2.5, 3.5]], dtype=F64)
    theirs, mine = sj_neuron.ILIFNode(step_mode="m"), our.ILIFNode(step_mode="m")
    assert theirs(x).tolist() == [[0.0, 2.0, 2.0, 4.0]]
    assert mine(x).tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_ilif_default_is_the_shipped_spec_and_other_windows_are_its_levels() -> None:
    assert ilif_spec(MultiLevelSpikeCount(4)) is load_spec("ilif")
    assert ilif_spec(sj_surrogate.MultiLevelSpikeCount(4)) is load_spec("ilif")
    three = ilif_spec(MultiLevelSpikeCount(3, grad_window=(1.0, 2.0)))
    assert three.levels is not None and len(three.levels) == 3
    assert three.levels[0].surrogate == ours.Custom("0")  # the window misses level 1's cell


@pytest.mark.parametrize("name", ["TernaryIFNode", "TernaryLIFNode", "ILIFNode"])
def test_signatures_are_theirs_then_backend(name: str) -> None:
    theirs, mine = _params(getattr(sj_neuron, name)), _params(getattr(our, name))
    assert mine[-1] == ("backend", None)
    assert [n for n, _ in mine[:-1]] == [n for n, _ in theirs]
    for (n, a), (_, b) in zip(theirs, mine[:-1]):
        if n != "surrogate_function":
            assert a == b, n
        elif name == "ILIFNode":
            assert (a.max_spike_count, a.grad_min, a.grad_max) == (b.max_spike_count, b.grad_min, b.grad_max)
        else:
            assert ours.get_surrogate(a) == ours.get_surrogate(b)


def _params(cls: type) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()][1:]


@pytest.mark.parametrize(("build", "error", "argument"), [
    (lambda: our.TernaryIFNode(v_threshold=0.0), ValueError, "v_threshold"),
    (lambda: our.TernaryIFNode(v_threshold="1"), TypeError, "v_threshold"),
    (lambda: our.TernaryIFNode(v_reset=1.0), ValueError, "v_reset"),
    (lambda: our.TernaryIFNode(v_reset=float("nan")), ValueError, "v_reset"),
    (lambda: our.TernaryIFNode(detach_reset=1), TypeError, "detach_reset"),
    (lambda: our.TernaryLIFNode(tau=1.0), ValueError, "tau"),
    (lambda: our.TernaryLIFNode(decay_input=None), TypeError, "decay_input"),
    (lambda: our.TernaryLIFNode(v_reset=-2.0), ValueError, "v_reset"),
    (lambda: our.ILIFNode(tau=0.5), ValueError, "tau"),
    (lambda: our.ILIFNode(surrogate_function=ours.Sigmoid()), ValueError, "surrogate_function"),
    (lambda: our.ILIFNode(surrogate_function=sj_surrogate.MultiLevelSpikeCount(2, spiking=False)), ValueError,
     "surrogate_function"),
    (lambda: MultiLevelSpikeCount(0), ValueError, "max_spike_count"),
    (lambda: MultiLevelSpikeCount(2.0), TypeError, "max_spike_count"),
    (lambda: MultiLevelSpikeCount(2, grad_window=(1.0, 0.0)), ValueError, "grad_window"),
])
def test_bad_arguments_are_refused_naming_them(build, error: type, argument: str) -> None:
    with pytest.raises(error, match=f"^{argument}"):
        build()
