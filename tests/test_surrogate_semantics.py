"""Surrogate semantics against the peers autocuda claims to match (SpikingJelly 2.0's surrogate modules and autograd
functions, snnTorch's): the gradient the generated kernels (host runner) and the reference use, against the peer's
own backward in float64, at 0, at tiny and huge |x| and at each parameter's edges; the forward's step at 0 (>= for
SpikingJelly, > for snnTorch); changes of a surrogate after a layer was built, on the layer and functional paths;
non-spiking mode against SpikingJelly's primitive; and what must be refused rather than silently replaced by
autocuda's formula of the same name: torch.nn.Sigmoid, a peer's subclass with its own spiking function or backward,
a user's autograd Function named as a peer's, two user classes of one name, a per-neuron tensor parameter.
Wider sweeps (every dtype, extreme parameters) under --slow. CPU only."""
from __future__ import annotations

import math

import pytest
import torch
from backends import NEEDS_HOST
from conftest import profile

import autocuda.nn as ann
from autocuda.base.errors import SpecError
from autocuda.call import functional as F
from autocuda.spec import surrogate as sg
from autocuda.spec.python import step_spec

sjs = pytest.importorskip("spikingjelly.activation_based.surrogate")
SLOW = pytest.mark.skipif(profile() != "slow", reason="wide sweep: --slow")

# every surrogate both libraries have, with its default and (slow) its parameters' edges
PARAMS: dict[str, list[dict[str, float]]] = {
    "Sigmoid": [{"alpha": 4.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "ATan": [{"alpha": 2.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "PiecewiseQuadratic": [{"alpha": 1.0}, {"alpha": 1e-6}, {"alpha": 50.0}],
    "PiecewiseExp": [{"alpha": 1.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "SoftSign": [{"alpha": 2.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "SuperSpike": [{"alpha": 1.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "NonzeroSignLogAbs": [{"alpha": 1.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "Erf": [{"alpha": 2.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "PiecewiseLeakyReLU": [{"w": 1.0, "c": 0.01}, {"w": 1e-3, "c": -0.5}, {"w": 1e3, "c": 0.0}],
    "S2NN": [{"alpha": 4.0, "beta": 1.0}, {"alpha": 1e3, "beta": -2.0}, {"alpha": 1e-6, "beta": 0.0}],
    "QPseudoSpike": [{"alpha": 2.0}, {"alpha": 1.000001}, {"alpha": 50.0}],
    "LeakyKReLU": [{"leak": 0.0, "k": 1.0}, {"leak": -0.3, "k": -2.0}],
    "FakeNumericalGradient": [{"alpha": 0.3}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "LogTailedReLU": [{"alpha": 0.0}, {"alpha": -1.0}, {"alpha": 0.5}],
    "Rect": [{"alpha": 1.0}, {"alpha": 1e-6}, {"alpha": 1e3}],
    "SquarewaveFourierSeries": [{"n": 2, "T_period": 8.0}, {"n": 1, "T_period": 8.0}, {"n": 7, "T_period": 0.5}],
    "DeterministicPass": [{}],
}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _points(params: dict[str, float]) -> torch.Tensor:
    """0, tiny and huge |x| (exp overflows), and the parameters' own break points (±1/α, ±w, ...) with their
    neighbours. Not the break points themselves where the documented formula differs from SpikingJelly's code (a set
    of measure zero, docs/surrogates.md): PiecewiseLeakyReLU's |x| = w; nor |x| where the period of a square wave
    makes float64's rounding of x the answer."""
    base = [0.0, 1e-300, 1e-30, 1e-8, 1e-3, 0.25, 0.5, 0.75, 1.0, 1.5, 3.0, 10.0, 100.0, 1e4]
    for value in params.values():
        for c in (value, 1 / value if value else 0.0, 1 / (2 * value) if value else 0.0):
            base += [math.nextafter(c, math.inf), math.nextafter(c, -math.inf)]
    return torch.tensor(sorted({p for b in base for p in (b, -b) if abs(p) < 1e5}), dtype=torch.float64)


def _peer_gradient(name: str, params: dict[str, float], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SpikingJelly's own forward and backward of `name` at x (float64)."""
    peer = getattr(sjs, name)(**{k: int(v) if k == "n" else v for k, v in params.items()})
    x = x.detach().clone().requires_grad_()
    y = peer(x)
    y.sum().backward()
    return y.detach(), x.grad


def _neuron_gradient(surrogate, x: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-step IF neuron at threshold 0, so the spike is Θ(x) and dspike/dx the surrogate's gradient."""
    x = x.detach().clone().requires_grad_()
    spike, _ = F.single_step("if", x, 0.0, surrogate=surrogate, v_threshold=0.0, backend=backend)
    spike.sum().backward()
    return spike.detach(), x.grad


def _check_against_peer(name: str, params: dict[str, float], backend: str, dtype: torch.dtype) -> None:
    surrogate = getattr(sg, name)(**params)
    x = _points(params).to(dtype)
    if name == "PiecewiseLeakyReLU":  # |x| = w: the documented closed interval, not SpikingJelly's code; and |x|
        # = w rounded to the dtype, which the kernel compares with w rounded alike (float64 has it on the other side)
        x = x[(x.double().abs() != params["w"]) & (x.abs() != torch.tensor(params["w"], dtype=dtype))]
    if name == "SquarewaveFourierSeries" and dtype != torch.float64:  # cos of a huge, rounded argument
        x = x[x.double().abs() < 100]
    x = x[~((x == 0) & x.signbit())]  # -1e-300 rounds to -0.0: SpikingJelly's FakeNumericalGradient is -inf there
    spike, gradient = _neuron_gradient(surrogate, x, backend)
    exact = x.double()
    peer_spike, peer = _peer_gradient(name, params, exact)
    assert torch.equal(spike.double(), peer_spike), "forward: Θ(0) = 1, as SpikingJelly's heaviside (x >= 0)"
    # float64 (SpikingJelly's sg·(1 - sg) underflows earlier than ours); a constant gradient is one number
    ours = torch.broadcast_to(surrogate.torch_gradient(exact), exact.shape)
    scale = ours.abs().max().item() or 1.0
    assert torch.allclose(ours, peer, rtol=1e-9, atol=1e-12 * scale), (name, params)
    largest = torch.finfo(dtype).max
    representable = ours.abs() <= largest
    got = gradient.double()
    assert torch.isfinite(got[representable]).all(), "inf or NaN where the float64 gradient is finite and representable"
    tolerance = TOLERANCE[dtype]
    # relative to the gradient's peak (cancellation near a break point), and no finer than the dtype's subnormals
    atol = tolerance * max(scale, torch.finfo(dtype).smallest_normal)
    torch.testing.assert_close(got[representable], ours[representable], rtol=tolerance, atol=atol,
                               msg=lambda m: f"{name}{params} {backend} {dtype}: {m}")


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_reference_gradient_and_step_match_spikingjelly(name):
    _check_against_peer(name, PARAMS[name][0], "reference", torch.float64)


@NEEDS_HOST
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_kernel_gradient_and_step_match_spikingjelly(name):
    _check_against_peer(name, PARAMS[name][0], "host", torch.float32)


@SLOW
@NEEDS_HOST
@pytest.mark.parametrize(("name", "params"), [(n, p) for n, ps in sorted(PARAMS.items()) for p in ps],
                         ids=lambda v: repr(v))
def test_every_parameter_edge_and_dtype_matches_spikingjelly(name, params):
    for backend in ("reference", "host"):
        for dtype in TOLERANCE:
            _check_against_peer(name, params, backend, dtype)


WITH_PRIMITIVE = sorted(n for n in PARAMS if sg.SURROGATES[n]._primitive is not sg.Surrogate._primitive)


@pytest.mark.parametrize("name", WITH_PRIMITIVE)
def test_non_spiking_mode_is_spikingjellys_primitive(name):
    """Forward the primitive, backward its derivative, as SpikingJelly's non-spiking mode (away from Rect's corners,
    where SpikingJelly's autograd through clamp passes 1 and the documented gradient 0)."""
    params = PARAMS[name][0]
    x = torch.tensor([-100.0, -3.0, -1.0, -0.7, -0.3, -1e-9, 0.0, 1e-9, 0.3, 0.7, 1.0, 1.5, 3.0, 100.0],
                     dtype=torch.float64)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = getattr(sg, name)(**params, spiking=False)(ours)
    want = getattr(sjs, name)(**{k: int(v) if k == "n" else v for k, v in params.items()}, spiking=False)(theirs)
    y.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-12, atol=1e-12)


# ---- what must be refused, not replaced by autocuda's formula of the same name ----

def test_torch_nn_sigmoid_is_no_surrogate():
    """torch.nn.Sigmoid (a forward of its own: SpikingJelly's node would output sigmoid(v - v_th)) was taken as
    autocuda's Sigmoid(alpha=4) because of its class name."""
    with pytest.raises(SpecError, match="torch.nn.modules.activation.Sigmoid defines its own forward"):
        sg.get_surrogate(torch.nn.Sigmoid())
    with pytest.raises(SpecError, match="Sigmoid"):
        ann.IFNode(surrogate_function=torch.nn.Sigmoid(), backend="torch")


class Sigmoid(sjs.Sigmoid):
    """A SpikingJelly Sigmoid whose spike function is ATan's: same name, another gradient."""

    @staticmethod
    def spiking_function(x, alpha):
        return sjs.atan.apply(x, alpha)


class ATan(sjs.ATan):
    """A subclass that changes nothing: it is SpikingJelly's ATan."""


def test_a_spikingjelly_subclass_with_its_own_spike_function_is_refused():
    peer = Sigmoid(alpha=2.0)
    with pytest.raises(SpecError, match="defines its own spiking_function"):
        sg.get_surrogate(peer)
    with pytest.raises(SpecError, match="defines its own spiking_function"):
        F.single_step("if", torch.zeros(3), surrogate=peer, backend="reference")
    assert sg.get_surrogate(ATan(alpha=3.0)) == sg.ATan(alpha=3.0)  # nothing of its own: SpikingJelly's ATan


def test_duck_typed_objects_and_spikingjellys_own_classes_are_still_taken():
    assert sg.get_surrogate(type("ATan", (), {"alpha": 3.0})()) == sg.ATan(alpha=3.0)
    for name in PARAMS:
        assert sg.get_surrogate(getattr(sjs, name)()) == getattr(sg, name)()


def _steep(factor: float) -> type[sg.Surrogate]:
    class Steep(sg.Sigmoid):  # one name, each its own gradient (a class edited and defined again in a notebook)
        def _gradient(self, x, alpha):
            return factor * alpha * sg._sg_slope(alpha * x)

    return Steep


@pytest.mark.parametrize("backend", ["reference", pytest.param("host", marks=NEEDS_HOST)])
def test_two_user_classes_of_one_name_keep_their_own_gradients(backend):
    """Their keys were (name, values) alone: the second class ran the first's kernel (also from the disk cache, in a
    later process)."""
    x = torch.tensor([-0.5, 0.0, 0.3], dtype=torch.float64)
    base = sg.Sigmoid().torch_gradient(x)
    for factor in (2.0, 3.0):
        _, gradient = _neuron_gradient(_steep(factor)(), x, backend)
        torch.testing.assert_close(gradient, factor * base)
    assert _steep(2.0)().key() != _steep(3.0)().key()
    assert sg.Sigmoid().key() == ("Sigmoid", (("alpha", 4.0),))  # ours keep their keys (and kernels)


def test_a_per_neuron_tensor_parameter_is_refused_by_name():
    peer = sjs.ATan()
    layer = ann.IFNode(surrogate_function=peer, backend="torch").double()
    layer(torch.zeros(2, dtype=torch.float64))
    peer.alpha = torch.tensor([1.0, 2.0])  # SpikingJelly broadcasts it; autocuda's parameters are numbers
    layer.reset()
    with pytest.raises(SpecError, match="'alpha' must be one number"):
        layer(torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
def test_a_tensor_parameter_changed_in_place_takes_effect(backend):
    """The layer compared the tensor object with itself: an in-place change was silently ignored."""
    peer = sjs.ATan(alpha=torch.tensor(2.0))
    layer = ann.IFNode(surrogate_function=peer, backend=backend).double()
    x = torch.tensor([0.5, 1.0, 1.3], dtype=torch.float64)
    for alpha in (2.0, 7.0):
        peer.alpha.fill_(alpha)
        layer.reset()
        xx = x.clone().requires_grad_()
        layer(xx).sum().backward()
        torch.testing.assert_close(xx.grad, sg.ATan(alpha=alpha).torch_gradient(x - 1.0))


# ---- traced steps (FlexSN, @autocuda.neuron): the spike function applied ----

class atan(torch.autograd.Function):  # noqa: N801 - a user's Function named as SpikingJelly's, its own backward
    @staticmethod
    def forward(ctx, x, alpha):
        return (x >= 0).to(x)

    @staticmethod
    def backward(ctx, grad):
        return 7.0 * grad, None


class sj_atan_subclass(sjs.atan):  # noqa: N801
    @staticmethod
    def backward(ctx, grad):
        return 7.0 * grad, None


sj_atan_subclass.__name__ = "atan"  # named as the base: only its backward differs


def _traced(spike_function):
    def step(x, v):
        h = v + x
        s = spike_function(h - 1.0)
        return s, h * (1 - s)

    return step_spec(step, ["v"], [])


@pytest.mark.parametrize("spike_function", [
    lambda z: atan.apply(z, 2.0),
    lambda z: sj_atan_subclass.apply(z, 2.0),
], ids=["user-function", "spikingjelly-subclass"])
def test_a_traced_spike_function_with_its_own_backward_is_refused(spike_function):
    with pytest.raises(SpecError, match="defines its own (forward|backward)"):
        _traced(spike_function)


def test_traced_library_spike_functions_are_still_taken():
    assert _traced(lambda z: sjs.atan.apply(z, 3.0)).surrogate == sg.ATan(alpha=3.0)
    snn = pytest.importorskip("snntorch.surrogate")

    class ATan(snn.ATan):
        @staticmethod
        def backward(ctx, grad):
            return 7.0 * grad, None

    with pytest.raises(SpecError, match="defines its own backward"):
        _traced(lambda z: ATan.apply(z, 2.0))
    traced = _traced(snn.atan(alpha=3.0))
    assert traced.surrogate == sg.ATan(alpha=3.0) and traced.spec.fires_at == ">"  # snnTorch's step: z > 0


# ---- changes after a layer was built ----

@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
@pytest.mark.parametrize("make", [sg.ATan, sjs.ATan], ids=["autocuda", "spikingjelly"])
def test_a_change_after_building_takes_effect_on_layer_and_functional_paths(make, backend):
    surrogate = make()
    layer = ann.IFNode(surrogate_function=surrogate, backend=backend).double()
    x = torch.tensor([-0.5, 0.0, 0.3], dtype=torch.float64)
    functional = "reference" if backend == "torch" else backend
    for alpha in (2.0, 7.0, 1e-3):
        layer.surrogate_function.alpha = alpha
        layer.reset()
        xx = (x + 1.0).requires_grad_()
        layer(xx).sum().backward()
        want = sg.ATan(alpha=alpha).torch_gradient(x)
        torch.testing.assert_close(xx.grad, want)
        torch.testing.assert_close(_neuron_gradient(surrogate, x, functional)[1], want)
    for bad, message in ((float("nan"), "finite"), (float("inf"), "finite"), (0.0, "> 0"), (-1.0, "> 0")):
        if make is sg.ATan:
            with pytest.raises(SpecError, match=f"'alpha' must be.*{message}"):
                surrogate.alpha = bad
            continue
        surrogate.alpha = bad  # SpikingJelly's object takes it; the next call refuses it by name
        layer.reset()
        with pytest.raises(SpecError, match=f"'alpha' must be.*{message}"):
            layer(x)
    surrogate.alpha = 2.0
    surrogate.set_spiking_mode(False)
    layer.reset()
    if backend == "host":
        with pytest.raises(ValueError, match="surrogate_function.*torch reference only"):
            layer(x)
    else:
        torch.testing.assert_close(layer(x), sg.ATan(spiking=False)(x - 1.0))


@pytest.mark.parametrize("peer", ["PoissonPass", "MultiLevelSpikeCount"])
def test_spikingjelly_surrogates_autocuda_lacks_are_refused_by_name(peer):
    made = getattr(sjs, peer)(*((3,) if peer == "MultiLevelSpikeCount" else ()))
    with pytest.raises(SpecError, match=f"cannot use {peer} as a surrogate"):
        F.single_step("if", torch.zeros(3), surrogate=made, backend="reference")


@pytest.mark.parametrize("made", [lambda: sg.DeterministicPass(), lambda: sg.SquarewaveFourierSeries(n=1)])
def test_a_constant_gradient_is_shaped_as_its_input(made) -> None:
    """`torch_gradient` of a surrogate whose gradient is a constant gave a 0-d tensor, not one per element."""
    x = torch.linspace(-1, 1, 6, dtype=torch.float64).view(2, 3)
    gradient = made().torch_gradient(x)
    assert gradient.shape == x.shape and gradient.dtype == x.dtype
