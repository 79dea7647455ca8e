"""Parameters given as tensors, and how the kernels spread them over the neurons (`codegen.broadcast`: one value,
one per channel, one per neuron, chosen by `call.program._spread` and `_kinds`): the generated kernels on the host
runner give the reference's spikes, states and gradients (float64) for every shape that broadcasts to the neuron
shape, on repeated calls of one program (its bound launch) as on its first, in layers whose parameters change in
place between calls, and under resets that take no `v_reset`."""
from __future__ import annotations

import pytest
import torch
from backends import NEEDS_HOST

import autocuda.nn as ann
from autocuda import spec_from_toml
from autocuda.call import functional as F

DT = torch.float64
T, B, C, H, W = 3, 2, 3, 4, 5

pytestmark = NEEDS_HOST


def _rand(shape, seed: int, low: float = 0.0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=DT) * scale + low


def _run(backend: str, spec, x: torch.Tensor, params: dict, single: bool = False, **kw):
    """Spikes, final states and the gradients of x and every parameter that requires grad, of one call."""
    x = x.detach().clone().requires_grad_()
    params = {n: (v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
              for n, v in params.items()}
    if single:
        spikes, finals = F.single_step(spec, x, backend=backend, **kw, **params)
    else:
        spikes, finals, _ = F.multi_step(spec, x, backend=backend, **kw, **params)
    loss = (spikes * _rand(spikes.shape, 9, 0.5)).sum() + sum((f * f).sum() for f in finals)
    leaves = [x, *(v for v in params.values() if isinstance(v, torch.Tensor) and v.requires_grad)]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad else ()
    return spikes.detach(), [f.detach() for f in finals], grads


def _assert_same(got, want) -> None:
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert len(got[2]) == len(want[2])
    for a, b in zip(got[2], want[2]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# -- every broadcast kind ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (1,), (C, 1, 1), (1, C, 1, 1), (B, 1, 1, 1), (H, W), (W,), (B, C, H, W)])
def test_each_broadcast_kind_equals_reference(shape) -> None:
    x = _rand((T, B, C, H, W), 0, scale=1.5)
    params = {"tau": _rand(shape, 1, 1.5).requires_grad_(), "v_threshold": _rand(shape, 2, 0.7)}
    _assert_same(_run("host", "lif", x, params), _run("reference", "lif", x, params))


def test_channel_params_on_two_dims_and_per_neuron_equal_reference() -> None:
    """Per-channel parameters naming different dims run per neuron; one per channel beside one per neuron."""
    x = _rand((T, B, C, H, W), 3, scale=1.5)
    for params in ({"beta": _rand((C, 1, 1), 4, 0.1).requires_grad_(), "tau_a": _rand((H, 1), 5, 5.0)},
                   {"beta": _rand((C, 1, 1), 4, 0.1).requires_grad_(), "tau": _rand((B, C, H, W), 6, 1.5)}):
        _assert_same(_run("host", "alif", x, params), _run("reference", "alif", x, params))


# -- a state that starts at a tensor parameter ---------------------------------------------------------------------
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(), (1,)])
def test_one_valued_v_reset_tensor_on_repeated_calls(shape, grad: bool, single: bool) -> None:
    """v starts at v_reset: given as a tensor of one value, every call (the program's bound launch from the second on)
    starts from that tensor. The second call raised AttributeError: 'float' object has no attribute 'dtype'."""
    x = _rand((T, 6), 7, scale=1.5)[0 if single else slice(None)]
    want = _run("reference", "lif", x, {"v_reset": _rand(shape, 8, -0.3).requires_grad_(grad)}, single)
    for _ in range(3):
        params = {"v_reset": _rand(shape, 8, -0.3).requires_grad_(grad)}
        _assert_same(_run("host", "lif", x, params, single), want)


# -- resets that take no v_reset -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (C, 1, 1), (B, C, H, W)])
def test_v_reset_tensor_under_a_soft_reset_is_not_read(shape) -> None:
    """reset='soft' takes v_reset as 0: a v_reset tensor is not read, spreads over no channel and has no gradient,
    as in the reference. One per channel raised "'lif' takes 2 scalars, got 4"; one needing a gradient
    KeyError: 'grad_v_reset' in backward."""
    x = _rand((T, B, C, H, W), 10, scale=1.5)
    for grad in (False, True):
        params = {"v_reset": _rand(shape, 11, -0.3).requires_grad_(grad), "tau": _rand((C, 1, 1), 12, 1.5)}
        for single in (False, True):
            got = _run("host", "lif", x[0] if single else x, params, single, reset="soft")
            _assert_same(got, _run("reference", "lif", x[0] if single else x, params, single, reset="soft"))
            if grad:
                assert got[2][-1] is None  # v_reset takes no part
            none = _run("host", "lif", x[0] if single else x, {"tau": params["tau"], "v_reset": None}, single)
            torch.testing.assert_close(got[0], none[0], rtol=0, atol=0)


def test_v_reset_tensor_of_a_soft_reset_spec_is_not_read() -> None:
    """The spec's own reset is soft: its v_reset, given as a tensor per channel, is not read either."""
    spec = spec_from_toml('name = "soft_lif_pb"\nreset = "soft"\ncharge = "v + (x - (v - v_reset)) / tau"\n'
                          '[params]\ntau = 2.0\nv_threshold = 1.0\nv_reset = 0.0\n[states]\nv = 0.0\n')
    x = _rand((T, B, C, H, W), 13, scale=1.5)
    params = {"v_reset": _rand((C, 1, 1), 14, -0.3).requires_grad_(), "tau": _rand((B, C, H, W), 15, 1.5)}
    _assert_same(_run("host", spec, x, params), _run("reference", spec, x, params))


# -- errors --------------------------------------------------------------------------------------------------------
def test_refused_shape_is_named_as_a_tuple_by_a_bound_program() -> None:
    """A shape with more dims than the neuron shape is refused, naming the neuron shape as a tuple also where a bound
    program checks the call (it said `torch.Size([2, 3, 4, 5])`)."""
    x = _rand((T, B, C, H, W), 16)
    for _ in range(3):  # bound from the first call on
        F.multi_step("lif", x, backend="host", tau=torch.full((1,), 2.0, dtype=DT))
    with pytest.raises(ValueError, match=r"parameter 'tau': shape \(1, 1, 1, 1, 1\) does not broadcast to the "
                                         r"neuron shape \(2, 3, 4, 5\)$"):
        F.multi_step("lif", x, backend="host", tau=torch.full((1, 1, 1, 1, 1), 2.0, dtype=DT))


# -- layers whose parameters change between calls ------------------------------------------------------------------
def _changes():
    def scale(p):
        p.data.mul_(1.3)

    def copy(p):
        with torch.no_grad():
            p.copy_(torch.full(p.shape, 2.7, dtype=DT))

    def per_channel(p):
        p.data = torch.linspace(1.2, 3.0, C, dtype=DT).view(C, 1, 1)

    def one(p):
        p.data = torch.full((1,), 2.9, dtype=DT)
    return [scale, copy, per_channel, one]


@pytest.mark.parametrize("change", _changes(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(1,), (C, 1, 1)])
def test_layer_takes_changed_parameter_values(shape, change) -> None:
    x = _rand((T, B, C, H, W), 17, scale=1.5)
    outputs = []
    for backend in ("host", "reference"):
        layer = ann.Neuron("lif", step_mode="m", backend=backend, tau=torch.nn.Parameter(_rand(shape, 18, 1.5)))
        for _ in range(3):  # the layer's fast path from here on
            layer(x)
            layer.detach()
        change(layer.tau)
        xi = x.clone().requires_grad_()
        spikes = layer(xi)
        outputs.append((spikes.detach(), [layer.v.detach()],
                        torch.autograd.grad((spikes * _rand(spikes.shape, 19)).sum(), [xi, layer.tau])))
    _assert_same(*outputs)
