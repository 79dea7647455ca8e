"""Edges of the surrogate objects (autocuda/spec/surrogate.py) as a user meets them standalone: non-spiking mode's
backward is the surrogate's gradient, finite where autograd through the primitive's own operations overflowed
into NaN (S2NN's keeps SpikingJelly's 1e-5); a change between a forward and its backward leaves that backward
as the forward ran; a change of a surrogate already used keeps its programs built, so fullgraph compiled code
retraces without sympy; parameters beyond float64's range, Custom's `spiking` and deleted parameters are refused
by name. CPU only."""
from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from autocuda.base.errors import SpecError
from autocuda.spec import surrogate as sg


@pytest.mark.parametrize(("surrogate", "point", "dtype"), [
    (sg.Sigmoid(spiking=False), -1000.0, torch.float32),   # exp(-αx) overflows: 1/(1 + inf)'s derivative inf/inf
    (sg.Sigmoid(spiking=False), -3.0, torch.float16),      # the same at αx < -11 in float16
    (sg.S2NN(spiking=False), -1000.0, torch.float64),      # its sigmoid branch
    (sg.PiecewiseExp(spiking=False), 1000.0, torch.float32),  # exp(αx)/2, the branch not picked, overflows
    (sg.NonzeroSignLogAbs(spiking=False), 1.0, torch.float64),  # log(1 - αx) = -inf on the branch not picked
    (sg.LogTailedReLU(spiking=False), 0.0, torch.float64),  # log(x) = -inf on the branch not picked
], ids=lambda v: repr(v) if isinstance(v, sg.Surrogate) else str(v))
def test_non_spiking_backward_is_the_gradient_where_the_primitive_overflows(surrogate, point, dtype):
    x = torch.tensor([point], dtype=dtype, requires_grad=True)
    surrogate(x).sum().backward()
    assert torch.isfinite(x.grad).all()  # autograd through the primitive's operations gave NaN here
    torch.testing.assert_close(x.grad, surrogate.torch_gradient(x.detach()))


def test_non_spiking_backward_differentiates_again_and_takes_the_transforms():
    s = sg.Sigmoid(alpha=2.0, spiking=False)
    x = torch.tensor([-1.5, -0.2, 0.3, 2.0], dtype=torch.float64, requires_grad=True)
    assert gradcheck(s, (x,)) and gradgradcheck(s, (x,))
    expected = 2.0 * torch.sigmoid(2.0 * x.detach()) * (1 - torch.sigmoid(2.0 * x.detach()))
    torch.testing.assert_close(torch.func.grad(lambda t: s(t).sum())(x.detach()), expected)
    torch.testing.assert_close(torch.func.jacfwd(s)(x.detach()).diagonal(), expected)
    torch.testing.assert_close(torch.func.vmap(s)(x.detach().view(2, 2)), torch.sigmoid(2.0 * x.detach()).view(2, 2))


def test_non_spiking_primitive_that_is_x_itself_backpropagates():
    x = torch.randn(5, requires_grad=True)
    y = sg.DeterministicPass(spiking=False)(x)
    torch.testing.assert_close(y, x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(5))


@pytest.mark.parametrize("change", ["alpha", "spiking"])
def test_a_change_of_a_used_surrogate_keeps_fullgraph_compiled_code_working(change):
    s = sg.Sigmoid()
    s.gradient_of_x()  # ready, as the docs ask before compiling
    compiled = torch.compile(lambda t: s(t * 1.0), backend="eager", fullgraph=True)
    x = torch.linspace(-2.0, 2.0, 7, requires_grad=True)
    compiled(x).sum().backward()
    if change == "alpha":
        s.alpha = 1.0  # dropped its programs: the retrace built them from sympy, which Dynamo cannot trace
    else:
        s.spiking = False  # the forward's primitive was never built
    x.grad = None
    y = compiled(x)
    y.sum().backward()
    expected = torch.sigmoid(4.0 * x.detach()) if change == "spiking" else (x.detach() >= 0).float()
    torch.testing.assert_close(y, expected)
    slope = torch.sigmoid(s.alpha * x.detach())
    torch.testing.assert_close(x.grad, s.alpha * slope * (1 - slope))


def test_a_value_a_used_surrogate_cannot_evaluate_is_refused_where_used():
    s = sg.ATan()
    s(torch.zeros(2, requires_grad=True)).sum().backward()
    s.alpha = 1e300  # valid, as in the constructor; its gradient's (pi/2 alpha)**2 is beyond float64
    with pytest.raises(SpecError, match="field 'surrogate'.*1e\\+300"):
        s(torch.zeros(2, requires_grad=True)).sum().backward()


def test_a_whole_number_beyond_float64_is_refused_naming_the_parameter():
    with pytest.raises(SpecError, match="'alpha' must be a finite number"):
        sg.Sigmoid(alpha=10**400)
    s = sg.Sigmoid()
    with pytest.raises(SpecError, match="'alpha' must be a finite number"):
        s.alpha = 10**400
    assert s.alpha == 4.0


def test_custom_takes_spiking_and_refuses_false_for_want_of_a_primitive():
    assert sg.Custom("a * x", a=2.0, spiking=True) == sg.Custom("a * x", a=2.0)
    with pytest.raises(SpecError, match="Custom has no primitive"):
        sg.Custom("x", spiking=False)
    with pytest.raises(TypeError, match="spiking must be True or False"):
        sg.Custom("x", spiking=1)


@pytest.mark.parametrize("spiking", [True, False])
def test_a_change_between_forward_and_backward_leaves_that_backward_as_forward_ran(spiking):
    s = sg.Sigmoid(alpha=4.0, spiking=spiking)
    x = torch.tensor([0.3, -0.1], dtype=torch.float64, requires_grad=True)
    y = s(x)
    s.alpha = 1.0  # as SpikingJelly's Functions (parameters taken by value) and the layers (frozen copies) do
    (grad,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    slope = torch.sigmoid(4.0 * x.detach())
    torch.testing.assert_close(grad, 4.0 * slope * (1 - slope))
    (second,) = torch.autograd.grad(grad.sum(), x)
    torch.testing.assert_close(second, 16.0 * slope * (1 - slope) * (1 - 2 * slope))


def test_deleting_a_parameter_is_refused_naming_it():
    s = sg.Sigmoid()
    for name in ("alpha", "spiking"):
        with pytest.raises(AttributeError, match=f"parameter '{name}' cannot be deleted"):
            delattr(s, name)
    assert s.alpha == 4.0 and s.spiking
