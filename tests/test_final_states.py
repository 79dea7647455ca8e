"""`store_final_states=False` on a neuron layer: a multi-step call keeps no states (the kernels write none), so each
call starts from the states as they were, as after `reset()`; on the full path, the keyed call, the functional
calls' programs, under torch.compile and in a fused BatchNorm; refused where a class runs multi-step calls of its
own; single steps unchanged."""
from __future__ import annotations

import pytest
import torch
from backends import NEEDS_HOST

import autocuda.nn as ann
from autocuda.call import native


def x_of(steps: int = 5, grad: bool = True) -> torch.Tensor:
    x = torch.rand(steps, 3, 4, generator=torch.Generator().manual_seed(steps), dtype=torch.float64) * 2
    return x.requires_grad_(grad)


def outcome(layer: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """A call's spikes and x's gradient (of the spikes, weighted)."""
    out = layer(x)
    return [out, *torch.autograd.grad((out * torch.arange(out.numel()).view_as(out)).sum(), x)]


def from_reset(layer: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    layer.reset()
    return outcome(layer, x)


def calls(layer: torch.nn.Module, x: torch.Tensor, times: int = 3, neuron: torch.nn.Module | None = None
          ) -> list[list[torch.Tensor]]:
    """The layer's calls one after another, without a reset between them; its neuron keeps no state."""
    results = []
    for _ in range(times):
        results.append(outcome(layer, x))
        kept = neuron or layer
        assert all(type(getattr(kept, name)) is float for name in kept.state_names), "no state kept"
    return results


@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
@pytest.mark.parametrize("spec", ["lif", "alif"])
def test_every_call_starts_from_the_initial_states(spec: str, backend: str) -> None:
    kept = ann.Neuron(spec, step_mode="m", backend=backend)
    free = ann.Neuron(spec, step_mode="m", backend=backend, store_final_states=False)
    x = x_of()
    want = from_reset(kept, x)
    for got in calls(free, x):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert "store_final_states=False" in repr(free)
    free.store_final_states = True  # takes effect at the next call
    free(x)
    assert isinstance(free.v, torch.Tensor) and free.v.shape == x.shape[1:]


@NEEDS_HOST
def test_the_keyed_call_keeps_no_states(native_on_host: None, keyed_results: list[list]) -> None:
    """After the first calls, the layer's keyed call runs it (native operator, host runner), writing no states;
    switching the flag back is a change the keyed call sees."""
    layer = ann.LIFNode(step_mode="m", backend="host")
    layer.store_final_states = False
    x = x_of()
    want = from_reset(ann.LIFNode(step_mode="m", backend="host"), x)
    results = calls(layer, x, 4)
    assert keyed_results and len(keyed_results[-1]) == 1 and native.USE, "the keyed call ran: the spikes alone"
    for got in results:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    layer.store_final_states = True
    layer(x.detach())
    assert isinstance(layer.v, torch.Tensor), "the switch, set back, took effect"


def test_compiled_calls_keep_no_states() -> None:
    layer = ann.Neuron("lif", step_mode="m", backend="torch", store_final_states=False)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = x_of()
    want = from_reset(ann.LIFNode(step_mode="m", backend="torch"), x)
    for got in calls(compiled, x, 2):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
def test_a_fused_batchnorm_keeps_no_states(backend: str) -> None:
    kept, free = (ann.BatchNormNeuron(3, ann.LIFNode(step_mode="m", backend=backend)).double() for _ in range(2))
    free.neuron.store_final_states = False
    x = (torch.rand(4, 2, 3, 5, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3)
    want = outcome(kept, x.requires_grad_())
    for got in calls(free, x, 2, free.neuron):  # float64, contiguous: both by the two-pass backward
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_single_steps_keep_their_states() -> None:
    layer = ann.Neuron("lif", step_mode="s", store_final_states=False)
    layer(torch.ones(3))
    assert isinstance(layer.v, torch.Tensor)


@pytest.mark.parametrize("name", ["GatedLIFNode", "STBIFNode"])
def test_classes_with_multi_step_calls_of_their_own_refuse_it(name: str) -> None:
    layer = getattr(ann, name)(**({"T": 4} if name == "GatedLIFNode" else {"q_threshold": 0.5, "level": 4}))
    with pytest.raises(TypeError, match="store_final_states: .* runs multi-step calls of its own"):
        layer.store_final_states = False
    layer.store_final_states = True
