"""`recompute=True` (functional.multi_step, every neuron layer, the fused BatchNorm) on the CPU, in float64 through
the reference and the host runner: the same spikes, states and gradients as keeping h, nothing of the neuron's own
kept between forward and backward (only the call's arguments), under torch.compile too; bad values refused."""
from __future__ import annotations

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from conftest import compile_launched, profile

import autocuda.nn as ann
from autocuda.call import functional as F

DT = torch.float64


def _input(seed: int, shape=(5, 3, 4, 6)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=DT) * 3


def _kept(run) -> dict[int, int]:
    """The storages of the tensors that autograd keeps for backward while `run()` builds its graph: their
    elements, by address."""
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes() // t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return kept


@pytest.fixture(scope="module", autouse=True)
def host_kernels() -> int:
    """The host kernels of the eager tests (their calls, run with the launches recorded), compiled up front many to
    a compiler run (`conftest.compile_launched`): the calls would compile them one a run."""
    return compile_launched(lambda: test_recompute_gives_the_same_results_and_gradients("host"),
                            test_backward_keeps_the_arguments_not_h, test_fused_batchnorm_keeps_its_input_alone,
                            lambda: test_fused_batchnorm_with_recompute_equals_without("host"))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_recompute_gives_the_same_results_and_gradients(backend: str) -> None:
    x, v0 = _input(0), _input(1)[0]
    tau = torch.linspace(1.5, 3.0, 4, dtype=DT).reshape(4, 1).requires_grad_()
    runs = []
    for recompute in (False, True):
        inp, state = x.clone().requires_grad_(), v0.clone().requires_grad_()
        spikes, (final,), (v_seq,) = F.multi_step("lif", inp, state, store_state_seq=True, backend=backend,
                                                  recompute=recompute, tau=tau)
        loss = (spikes * 1.3).sum() + (v_seq * 0.7).sum() + final.sum()
        runs.append((spikes, final, v_seq, *torch.autograd.grad(loss, (inp, state, tau))))
    for want, got in zip(*runs):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert runs[0][0].sum() > 0


@NEEDS_HOST
def test_backward_keeps_the_arguments_not_h() -> None:
    x = _input(2).requires_grad_()
    address = x.untyped_storage().data_ptr()
    layer = ann.LIFNode(step_mode="m", backend="host")
    normal = _kept(lambda: layer(x))
    layer.reset()
    layer.recompute = True
    recomputed = _kept(lambda: layer(x))
    assert address not in normal and max(normal.values()) == x.numel()  # LIF's backward reads h, not x
    assert recomputed == {address: x.numel()}


@NEEDS_HOST
def test_fused_batchnorm_keeps_its_input_alone() -> None:
    """The fused layer keeps x for its statistics anyway, and its kernels save no h (they replay it from x):
    with recompute or without, nothing else of x's size is kept."""
    x = _input(3, (4, 2, 3, 5, 5)).requires_grad_()
    address = x.untyped_storage().data_ptr()
    for recompute, others in ((False, 0), (True, 0)):
        layer = ann.BatchNormNeuron(3, ann.Neuron("lif", step_mode="m", backend="host", recompute=recompute)).to(DT)
        kept = _kept(lambda layer=layer: layer(x))
        assert address in kept
        large = [a for a, n in kept.items() if a != address and n >= x.numel()]
        assert len(large) == others, f"recompute={recompute}: {len(large)} tensors of x's size kept besides x"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fused_batchnorm_with_recompute_equals_without(backend: str) -> None:
    x = _input(4, (4, 2, 3, 5, 5))
    results = []
    for recompute in (False, True):
        layer = ann.BatchNormNeuron(3, ann.Neuron("lif", step_mode="m", backend=backend, recompute=recompute)).to(DT)
        inp = x.clone().requires_grad_()
        out = layer(inp)
        (out * torch.linspace(0, 1, out.numel(), dtype=DT).reshape(out.shape)).sum().backward()
        results.append((out, inp.grad, layer.weight.grad, layer.bias.grad, layer.running_var))
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# Inductor with --slow; by default AOTAutograd without Inductor's code generation (`aot_eager`): what recompute
# changes in a compiled graph, the saved tensors and the backward's replay of the forward kernel, AOTAutograd decides;
# our op meets Inductor itself in test_batchnorm's and test_memory_order's default compiles.
COMPILER = "inductor" if profile() == "slow" else "aot_eager"


@NEEDS_HOST
def test_compiled_fullgraph_with_recompute_equals_eager() -> None:
    eager, compiled_layer = (ann.Neuron("lif", step_mode="m", backend="host", recompute=True) for _ in range(2))
    compiled = torch.compile(compiled_layer, fullgraph=True, backend=COMPILER)
    x = _input(5)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(a), compiled(b)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (want * 1.5).sum().backward()
    (got * 1.5).sum().backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


def test_a_layer_shows_recompute_when_set() -> None:
    layer = ann.LIFNode(step_mode="m")
    assert "recompute" not in repr(layer)
    layer.recompute = True
    assert "recompute=True" in repr(layer)


def test_recompute_takes_a_bool() -> None:
    with pytest.raises(TypeError, match="recompute: expected True or False, got 1"):
        F.multi_step("lif", _input(6), recompute=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="recompute: expected True or False"):
        ann.Neuron("lif", recompute="yes")  # type: ignore[arg-type]
    with torch.no_grad():  # nothing to recompute: the call runs as without
        spikes, _, _ = F.multi_step("lif", _input(7), recompute=True, backend="reference")
    assert spikes.shape == (5, 3, 4, 6)
