"""SpikingJelly's LIF nodes for online training (autocuda.nn.spikingjelly_online) in float64 on the CPU against
SpikingJelly's own classes: over several training steps (each from the detached membrane) the spikes, OTTT's
traces, the memories and each step's input gradient; evaluation steps; reset; on the reference and the host
runner; the refusals (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import functools

import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched
from sj_signatures import assert_signature_is_theirs_then_backend

import autocuda.nn as our

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based.neuron import online_learning as sj_online
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
CASES = [("OTTTLIFNode", {}), ("OTTTLIFNode", {"v_reset": 0.0, "decay_input": True, "detach_reset": False}),
         ("SLTTLIFNode", {}), ("SLTTLIFNode", {"v_reset": None, "tau": 3.0, "store_v_seq": True})]


def outputs_of(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, list) else [out]


def steps(layer: torch.nn.Module, xs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Each step's outputs, with the step's own backward (online training: a loss per step)."""
    results = []
    for t, x in enumerate(xs):
        out = outputs_of(layer(x))
        (out[0] * (t + 1 + torch.arange(out[0].numel(), dtype=F64).view_as(out[0]))).sum().backward()
        results.append([o.detach() for o in out])
    return results


@pytest.fixture(scope="module", autouse=True)
def host_kernels() -> int:
    """The host kernels of the host cases (their calls, run with the launches recorded), compiled up front many to
    a compiler run (`conftest.compile_launched`): the calls would compile them one a run."""
    return compile_launched(*(functools.partial(test_online_nodes_as_theirs, name, kwargs, "host")
                              for name, kwargs in CASES))


@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_online_nodes_as_theirs(name: str, kwargs: dict, backend: str) -> None:
    theirs, mine = getattr(sj_online, name)(**kwargs), getattr(our, name)(backend=backend, **kwargs)
    torch.manual_seed(0)
    data = [1.5 * torch.rand(3, 5, dtype=F64) for _ in range(4)]
    xs, ys = [x.clone().requires_grad_() for x in data], [x.clone().requires_grad_() for x in data]
    for a, b in zip(steps(theirs, xs), steps(mine, ys)):  # training: [spike, trace] for OTTT
        assert len(a) == len(b) == (2 if name == "OTTTLIFNode" else 1)
        for got, expected in zip(b, a):
            torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
    for x, y in zip(xs, ys):  # each step's gradient alone: nothing flows back in time
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    memories = dict(mine.named_memories())
    for key, value in theirs.named_memories():
        torch.testing.assert_close(memories[key], value, rtol=1e-13, atol=1e-13, msg=key)
    if kwargs.get("store_v_seq"):
        torch.testing.assert_close(mine.v_seq, theirs.v_seq, rtol=1e-13, atol=1e-13)
    theirs.reset(), mine.reset()
    assert [n for n, _ in mine.named_memories()] == [n for n, _ in theirs.named_memories()]
    assert dict(mine.named_memories()) == dict(theirs.named_memories())
    theirs.eval(), mine.eval()  # evaluation: the membrane is not detached, the spike has no gradient
    xs, ys = [x.clone().requires_grad_() for x in data[:2]], [x.clone().requires_grad_() for x in data[:2]]
    for x, y in zip(xs, ys):
        a, b = theirs(x), mine(y)
        assert isinstance(b, torch.Tensor) and torch.equal(a, b) and not b.requires_grad
    theirs.v.sum().backward(), mine.v.sum().backward()  # through both steps' membranes
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)


@NEEDS_HOST
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_training_steps_take_the_layers_keyed_call(name: str, kwargs: dict, native_on_host: None,
                                                   keyed_results: list[list]) -> None:
    """Online training through the layer's keyed call (`nn.layer_call.run_keyed`, from the detached membrane):
    once the programs and their native plans are made, every training step runs by it (none where v_seq is stored:
    each step appends to it on the full path), with SpikingJelly's results and gradients."""
    theirs, mine = getattr(sj_online, name)(**kwargs), getattr(our, name)(backend="host", **kwargs)
    data = [1.5 * torch.rand(3, 5, dtype=F64, generator=torch.Generator().manual_seed(t)) for t in range(4)]
    for _ in range(3):  # the programs, then their native plans, then every step by the keyed call
        theirs.reset(), mine.reset()
        keyed_results.clear()
        xs, ys = [x.clone().requires_grad_() for x in data], [x.clone().requires_grad_() for x in data]
        for a, b in zip(steps(theirs, xs), steps(mine, ys)):
            for got, expected in zip(b, a):
                torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
        for x, y in zip(xs, ys):
            torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    ran = [bool(results) for results in keyed_results]
    assert ran == ([] if kwargs.get("store_v_seq") else [True] * len(data)), "every training step by the keyed call"


@pytest.mark.parametrize("name", ["OTTTLIFNode", "SLTTLIFNode"])
def test_signatures_are_theirs_then_backend(name: str) -> None:
    assert_signature_is_theirs_then_backend(getattr(sj_online, name), getattr(our, name))


@pytest.mark.parametrize(("build", "error", "words"), [
    (lambda: our.OTTTLIFNode(step_mode="m"), ValueError, "^step_mode"),
    (lambda: setattr(our.SLTTLIFNode(), "step_mode", "m"), ValueError, "^step_mode"),
    (lambda: our.SLTTLIFNode(tau=1.0), ValueError, "^tau"),
])
def test_bad_input_is_refused_naming_it(build, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        build()
