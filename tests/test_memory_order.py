"""Inputs in another memory order (channels_last, permuted views) on the CPU, in float64 through the reference and
the host runner: the same spikes, states and gradients as the contiguous input, outputs in the input's layout,
and the kernels reading the input where it lies (no copy). Also the layouts the call must copy (not dense), and
that errors name the shapes as the caller passed them."""
from __future__ import annotations

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from conftest import profile

import autocuda.nn as ann
from autocuda.call import functional as F
from autocuda.call import native, ops
from autocuda.call.memory_order import memory_order

DT = torch.float64
CL = torch.channels_last


def _sequence(seed: int, shape=(3, 2, 4, 5, 6)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=DT) * 3


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """x [T, B, C, H, W] with each step laid out channels-last."""
    return x.flatten(0, 1).contiguous(memory_format=CL).unflatten(0, x.shape[:2])


def _grads(outputs, inputs, seed: int):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.rand(o.shape, generator=g, dtype=DT)).sum() for o in outputs)
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_channels_last_sequence_equals_contiguous(backend: str) -> None:
    x = _sequence(0)
    tau = torch.linspace(1.5, 3.0, 4, dtype=DT).reshape(4, 1, 1).requires_grad_()  # one per channel
    v0 = torch.rand(2, 4, 5, 6, dtype=DT, generator=torch.Generator().manual_seed(1))
    results = []
    for inp, state in ((x, v0), (_channels_last(x), v0.contiguous(memory_format=CL))):
        inp, state = inp.clone().requires_grad_(), state.clone().requires_grad_()
        spikes, (final,), (v_seq,) = F.multi_step("lif", inp, state, store_state_seq=True, backend=backend, tau=tau)
        results.append((inp, spikes, final, v_seq, _grads((spikes, final, v_seq), (inp, state, tau), seed=2)))
    (x1, *want, grads_want), (x2, *got, grads_got) = results
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    spikes, final, v_seq = got
    assert spikes.stride() == x2.stride() and v_seq.stride() == x2.stride()  # the input's layout
    assert final.is_contiguous(memory_format=CL) and not final.is_contiguous()
    assert grads_got[0].stride() == x2.stride()


@NEEDS_HOST
def test_kernels_read_the_input_where_it_lies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "USE", False)  # the Python path's launch is what is watched
    seen = []
    launch = ops.forward_eager

    def spy(form, x, *args):
        seen.append(x.data_ptr())
        return launch(form, x, *args)

    monkeypatch.setattr(ops, "forward_eager", spy)
    x = _channels_last(_sequence(3))
    F.multi_step("lif", x, backend="host")
    F.single_step("lif", x[0], backend="host")
    assert seen == [x.data_ptr(), x[0].data_ptr()]
    transposed = _sequence(4, (3, 2, 6, 5)).transpose(2, 3)  # any dense order, not only channels_last
    F.multi_step("lif", transposed, backend="host")
    assert seen[-1] == transposed.data_ptr()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_single_step_keeps_the_layout_of_input_and_states(backend: str) -> None:
    x, v = _sequence(5)[0], _sequence(6)[0]
    want_spike, (want_v,) = F.single_step("lif", x, v, backend=backend, tau=3.0)
    spike, (new_v,) = F.single_step("lif", x.contiguous(memory_format=CL), v.contiguous(memory_format=CL),
                                    backend=backend, tau=3.0)
    torch.testing.assert_close(spike, want_spike, rtol=0, atol=0)
    torch.testing.assert_close(new_v, want_v, rtol=0, atol=0)
    assert spike.is_contiguous(memory_format=CL) and new_v.is_contiguous(memory_format=CL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_layouts_that_are_not_dense_are_copied_and_give_the_same_results(backend: str) -> None:
    wide = _sequence(7, (3, 2, 4, 5, 12))
    strided = wide[..., ::2]  # every other element: dense in no order
    assert memory_order(strided, 1, (), {}) is None
    want, _, _ = F.multi_step("lif", strided.contiguous(), backend=backend)
    got, _, _ = F.multi_step("lif", strided, backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_errors_name_the_shapes_the_caller_passed() -> None:
    x = _channels_last(_sequence(8))
    with pytest.raises(ValueError, match=r"expected shape \(2, 4, 5, 6\).*got \(2, 4, 5\)"):
        F.multi_step("lif", x, torch.zeros(2, 4, 5, dtype=DT), backend="reference")
    with pytest.raises(ValueError, match=r"shape \(3, 1, 1, 1, 1\) does not broadcast"):
        F.multi_step("lif", x, backend="reference", tau=torch.ones(3, 1, 1, 1, 1, dtype=DT))
    with pytest.raises(ValueError, match=r"shape \(3,\) does not broadcast to the neuron shape \(2, 4, 5, 6\)"):
        F.multi_step("lif", x, backend="reference", tau=torch.ones(3, dtype=DT))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_layer_keeps_its_states_in_the_input_layout_across_calls(backend: str) -> None:
    contiguous, channels_last = (ann.LIFNode(step_mode="m", backend=backend) for _ in range(2))
    for seed in (9, 10):
        x = _sequence(seed)
        torch.testing.assert_close(channels_last(_channels_last(x)), contiguous(x), rtol=0, atol=0)
        torch.testing.assert_close(channels_last.v, contiguous.v, rtol=0, atol=0)
        assert channels_last.v.is_contiguous(memory_format=CL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fused_batchnorm_on_channels_last_equals_contiguous(backend: str) -> None:
    layers = [ann.BatchNormNeuron(4, ann.LIFNode(step_mode="m", backend=backend)).to(DT) for _ in range(2)]
    with torch.no_grad():
        for layer in layers:
            layer.weight.copy_(torch.linspace(0.5, 1.5, 4, dtype=DT))
            layer.bias.copy_(torch.linspace(-0.5, 0.5, 4, dtype=DT))
    x = _sequence(11)
    x1, x2 = x.clone().requires_grad_(), _channels_last(x).requires_grad_()
    want, got = layers[0](x1), layers[1](x2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.stride() == x2.stride()
    g = torch.rand(x.shape, dtype=DT, generator=torch.Generator().manual_seed(12))
    (want * g).sum().backward()
    (got * g).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-10, atol=1e-12)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(layers[1], name).grad, getattr(layers[0], name).grad, rtol=1e-10,
                                   atol=1e-12)
    torch.testing.assert_close(layers[1].running_var, layers[0].running_var, rtol=1e-12, atol=1e-14)


@NEEDS_HOST
def test_compiled_fullgraph_on_channels_last_equals_eager() -> None:
    eager = ann.LIFNode(step_mode="m", backend="host")
    compiled = torch.compile(ann.LIFNode(step_mode="m", backend="host"), fullgraph=True)
    x = _channels_last(_sequence(13))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(x1), compiled(x2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.stride() == x.stride()
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-12, atol=1e-12)


# The dynamic-shapes compile below checks our op's fake kernel on symbolic strides, which AOTAutograd's trace (the
# "aot_eager" backend) runs as Inductor's does; Inductor's own handling of a channels-last layer around our op is
# test_compiled_fullgraph_on_channels_last_equals_eager's, by default, and this test's too with --slow.
DYNAMIC_COMPILER = "inductor" if profile() == "slow" else "aot_eager"


def test_compiled_with_dynamic_shapes_on_channels_last_equals_eager() -> None:
    """Under dynamic shapes the strides are symbolic: the dim order is still found (pairwise comparisons).
    Compiled with aot_eager by default, Inductor with --slow (`DYNAMIC_COMPILER`)."""
    import autocuda.nn as ann

    eager, compiled_layer = (ann.Neuron("lif", step_mode="m", backend="host") for _ in range(2))
    compiled = torch.compile(compiled_layer, fullgraph=True, dynamic=True, backend=DYNAMIC_COMPILER)
    for batch in (2, 3):
        x = (torch.rand(4, batch, 3, 5, 6, dtype=torch.float64) * 2).permute(0, 1, 3, 4, 2).contiguous() \
            .permute(0, 1, 4, 2, 3)
        eager.reset()
        compiled_layer.reset()
        want, got = eager(x), compiled(x)
        assert torch.equal(got, want) and got.stride() == want.stride()
