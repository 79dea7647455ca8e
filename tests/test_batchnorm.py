"""BatchNorm fused into the neuron (CPU): the spec transform `with_input_affine`, `BatchNormNeuron` against the
unfused pair (torch's BatchNorm then our neuron) in float64 through the reference and the host runner (forward
spikes, every gradient, running statistics over several training steps, eval mode), `fuse_batchnorm` on
SpikingJelly's spiking_vgg11_bn and on a module that calls its BatchNorm and neuron itself, torch.compile, and
bad input."""
from __future__ import annotations

import copy
import functools
import re
import sys
import types
from unittest import mock

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from conftest import compile_launched, profile
from torch import nn

import autocuda.nn as ann
from autocuda.base.errors import SpecError
from autocuda.call import functional as F
from autocuda.spec.load import load_spec
from autocuda.spec.model import NeuronSpec
from autocuda.spec.transform import with_input_affine

BACKENDS = CPU_BACKENDS
DT = torch.float64


def _bn(channels: int, dims: int = 2, seed: int = 0, **kwargs) -> nn.Module:
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims](channels, **kwargs).to(DT)
    if bn.weight is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            bn.weight.copy_(torch.rand(channels, generator=g, dtype=DT) + 0.5)
            bn.bias.copy_(torch.rand(channels, generator=g, dtype=DT) - 0.5)
    return bn


def _input(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=DT) * 2 + 0.5).requires_grad_()


# ---- the spec transform ---------------------------------------------------------------------------------
def test_transform_replaces_the_input_in_every_field_that_reads_it() -> None:
    spec = NeuronSpec("toy", params={"v_reset": 0.0, "v_threshold": 1.0, "xa": 0.5, "tau": 2.0},
                      states={"v": 0.0, "w": 0.0}, charge="v + (x - v) / tau + xa",
                      updates={"w": "w + x * s + xa * h"})
    fused = with_input_affine(spec)
    assert fused.charge == "v + (in_scale * x + in_shift - v) / tau + xa"  # `xa` is another name: kept
    assert dict(fused.updates)["w"] == "w + (in_scale * x + in_shift) * s + xa * h"
    assert [p.name for p in fused.params][-2:] == ["in_scale", "in_shift"]
    assert all(p.kind == "tensor" and p.learnable for p in fused.params[-2:])
    ode = with_input_affine(load_spec("sfa_lif"))
    assert "R * (in_scale * x + in_shift)" in dict(ode.ode)["v"]
    assert with_input_affine(load_spec("lif")).name == "lif_affine"


def test_transform_refuses_a_spec_that_has_the_names_already() -> None:
    spec = NeuronSpec("toy", params={"v_reset": 0.0, "v_threshold": 1.0, "in_shift": 0.0},
                      states={"v": 0.0}, charge="v + x + in_shift")
    with pytest.raises(SpecError, match="in_shift"):
        with_input_affine(spec)
    with pytest.raises(TypeError, match="NeuronSpec"):
        with_input_affine("lif")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["lif", "izhikevich", "sfa_lif"])
def test_transformed_spec_is_the_spec_on_the_affine_input(name: str) -> None:
    spec = load_spec(name)
    x = _input(4, 3, 5, seed=1)
    a = (torch.rand(3, 1, dtype=DT) + 0.5).requires_grad_()
    b = (torch.rand(3, 1, dtype=DT) - 0.5).requires_grad_()
    fused, _, _ = F.multi_step(with_input_affine(spec), x, backend="reference", in_scale=a, in_shift=b)
    plain, _, _ = F.multi_step(spec, a * x + b, backend="reference")
    torch.testing.assert_close(fused, plain, rtol=0, atol=0)
    weights = torch.randn_like(plain)
    for got, want in zip(torch.autograd.grad((fused * weights).sum(), (x, a, b)),
                         torch.autograd.grad((plain * weights).sum(), (x, a, b))):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_kernels_read_the_affine_once_per_neuron_outside_the_time_loop() -> None:
    spec = with_input_affine(load_spec("lif"))
    per_neuron = ("in_scale", "in_shift")
    for kernel, pattern in (("fptt", r"\busr_in_(scale|shift)\["), ("bptt", r"\busr_(grad_)?in_(scale|shift)\[")):
        source = spec.source(kernel, "float32", per_neuron=per_neuron)
        loop = source.index("for (long long t")
        end = source.index("\n    }\n", loop)  # the time loop's closing brace (one indent: the kernel body's)
        assert re.search(pattern, source[:loop]) or re.search(pattern, source[end:])
        assert not re.search(pattern, source[loop:end]), kernel


# ---- BatchNormNeuron against the unfused pair ---------------------------------------------------------------
def _pair(mode: str, backend: str, bn: nn.Module, neuron: nn.Module):
    """(unfused forward, fused layer): the unfused one is SeqToANNContainer's (T folded) for 'm', per step for 's'."""
    fused = ann.BatchNormNeuron.from_batchnorm(copy.deepcopy(bn), copy.deepcopy(neuron))

    def unfused(x: torch.Tensor) -> torch.Tensor:
        if mode == "m":
            return neuron(bn(x.flatten(0, 1)).view(x.shape))
        return neuron(bn(x))
    return unfused, fused


def _run(layer, x: torch.Tensor, mode: str) -> torch.Tensor:
    return layer(x) if mode == "m" else torch.stack([layer(step) for step in x])


def _train_once(mode: str, neuron: nn.Module) -> None:
    """One training call of the fused layer around `neuron` (on the host runner), its backward, and an eval call."""
    fused = ann.BatchNormNeuron.from_batchnorm(_bn(4), neuron)
    x = _input(3, 2, 4, 3, 3, seed=0)
    (_run(fused, x, mode) * torch.randn(3, 2, 4, 3, 3, dtype=DT)).sum().backward()
    fused.eval()
    _run(fused, x, mode)


@pytest.fixture(scope="module")
def host_kernels() -> int:
    """The host kernels of the tests on the host runner, compiled up front many to a compiler run
    (`conftest.compile_launched`): the tests would compile them one kernel a run."""
    calls = [functools.partial(_train_once, mode, ann.ParametricLIFNode(step_mode=mode, backend="host"))
             for mode in ("m", "s")]
    calls.append(functools.partial(_train_once, "m", ann.LIFNode(step_mode="m", backend="host")))
    return compile_launched(*calls)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["m", "s"])
def test_fused_equals_unfused_over_training_steps_and_in_eval(backend: str, mode: str,
                                                              request: pytest.FixtureRequest) -> None:
    if backend == "host":
        request.getfixturevalue("host_kernels")
    bn = _bn(4)
    neuron = ann.ParametricLIFNode(step_mode=mode, backend=backend)  # a learnable neuron parameter too
    unfused, fused = _pair(mode, backend, bn, neuron)
    for step in range(3):
        x = _input(3, 2, 4, 3, 3, seed=step)
        x2 = x.detach().clone().requires_grad_()
        want, got = _run(unfused, x, mode), _run(fused, x2, mode)
        assert 0 < want.sum() < want.numel()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        weights = torch.randn_like(want)
        ours = (x2, fused.weight, fused.bias, fused.neuron.w)
        grads = torch.autograd.grad((got * weights).sum(), ours)
        for g, w in zip(grads, torch.autograd.grad((want * weights).sum(), (x, bn.weight, bn.bias, neuron.w))):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(fused, name), getattr(bn, name), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(fused.neuron.v, neuron.v, rtol=1e-12, atol=1e-12)  # states kept in the neuron
        neuron.reset()
        fused.reset()
    bn.eval()
    fused.eval()
    x = _input(3, 2, 4, 3, 3, seed=9)
    want = _run(unfused, x, mode)
    got = _run(fused, x.detach().requires_grad_(), mode)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert int(fused.num_batches_tracked) == (3 if mode == "m" else 9)  # 's': one batch per step


@pytest.mark.parametrize(("kwargs", "dims", "shape"), [
    ({"momentum": None}, 2, (3, 2, 4, 3, 3)),            # cumulative average
    ({"affine": False}, 2, (3, 2, 4, 3, 3)),
    ({"track_running_stats": False}, 2, (3, 2, 4, 3, 3)),
    ({}, 1, (3, 5, 4)), ({}, 1, (3, 2, 4, 6)), ({}, 3, (2, 2, 4, 2, 2, 3)),
])
def test_batchnorm_options_and_dims(kwargs: dict, dims: int, shape: tuple[int, ...]) -> None:
    bn = _bn(4, dims, **kwargs)
    unfused, fused = _pair("m", "reference", bn, ann.LIFNode(step_mode="m", backend="reference"))
    for step in range(3):
        x = _input(*shape, seed=step)
        x2 = x.detach().clone().requires_grad_()
        want, got = unfused(x), fused(x2)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        grad, = torch.autograd.grad((got * got.new_tensor(range(got.numel())).view_as(got)).sum(), x2)
        expected, = torch.autograd.grad((want * want.new_tensor(range(want.numel())).view_as(want)).sum(), x)
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
        if bn.running_mean is not None:
            torch.testing.assert_close(fused.running_var, bn.running_var, rtol=1e-12, atol=1e-14)
    bn.eval()
    fused.eval()
    x = _input(*shape, seed=7)
    torch.testing.assert_close(fused(x), unfused(x), rtol=0, atol=0)


# dtype -> (largest share of differing spikes, relative error of gradients and running statistics): the two
# compute the affine in another order, and the fused one does not round it to the storage dtype
TOLERANCE = {torch.float32: (1e-3, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 1e-1)}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_low_precision_and_autocast(dtype: torch.dtype) -> None:
    spikes, tol = TOLERANCE[dtype]
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8).to(dtype)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    unfused, fused = _pair("m", "reference", bn, ann.LIFNode(step_mode="m"))
    x = (torch.randn(4, 8, 8, 6, 6) * 2 + 0.5).to(dtype).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    want, got = unfused(x), fused(x2)
    assert got.dtype == dtype and (got != want).double().mean() <= spikes
    weights = torch.randn_like(want)
    (want * weights).sum().backward()
    (got * weights).sum().backward()
    for ours, theirs in ((x2.grad, x.grad), (fused.weight.grad, bn.weight.grad), (fused.running_var, bn.running_var)):
        assert _relative(ours, theirs) < tol
    if dtype == torch.bfloat16:  # autocast: the statistics and running statistics stay float32
        conv, bn32 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        unfused, fused = _pair("m", "reference", bn32, ann.LIFNode(step_mode="m"))
        with torch.autocast("cpu", dtype=dtype):
            y = conv(torch.rand(32, 3, 6, 6) * 3).view(4, 8, 8, 6, 6)
            want, got = unfused(y), fused(y)
        assert y.dtype == got.dtype == dtype and (got != want).double().mean() <= spikes
        assert fused.running_var.dtype == torch.float32 and _relative(fused.running_var, bn32.running_var) < 1e-5


def _kept(kept: list[torch.Tensor], t: torch.Tensor) -> torch.Tensor:
    kept.append(t)
    return t


@NEEDS_HOST
def test_the_neurons_save_h_takes_effect_in_half_types() -> None:
    """In bfloat16 the fused layer's kernels save h, unless its neuron's `save_h` is False: then backward replays
    h from x (which the statistics keep anyway), and no [T, N] sequence but x is kept."""
    x = (torch.randn(4, 2, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 + 0.5).to(torch.bfloat16)
    results = {}
    for save_h in (True, False):
        layer = ann.BatchNormNeuron(3, ann.LIFNode(step_mode="m", backend="host")).to(torch.bfloat16)
        layer.neuron.save_h = save_h
        given = x.clone().requires_grad_()
        kept: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(functools.partial(_kept, kept), lambda t: t):
            out = layer(given)
        sequences = [t for t in kept if t.numel() == x.numel() and t.data_ptr() != given.data_ptr()]
        assert len(sequences) == save_h, "h [T, N] is kept where save_h holds, else x alone"
        (out * torch.linspace(0.5, 1.5, out.numel()).view(out.shape)).sum().backward()
        results[save_h] = (out, given.grad, layer.weight.grad)
    assert torch.equal(results[True][0], results[False][0])
    for replayed, saved in zip(results[False][1:], results[True][1:]):
        assert _relative(replayed, saved) < 2e-2  # backward reads h rounded to bfloat16, or replays it in float


@pytest.mark.parametrize(("shape", "channel"), [((3, 2, 4, 3, 3), 2), ((5, 4), 1), ((2, 4, 6), 1)])
def test_statistics_gradient(shape: tuple[int, ...], channel: int) -> None:
    """The one-pass backward of the batch statistics is their derivative."""
    from autocuda.nn.batchnorm import _Statistics

    x = _input(*shape, seed=3)
    count = x.numel() // shape[channel]
    assert torch.autograd.gradcheck(lambda t: _Statistics.apply(t, channel, count), (x,))


@pytest.mark.parametrize("make", [lambda: ann.LIFNode(v_reset=None, step_mode="m", store_v_seq=True),
                                  lambda: ann.IzhikevichNode(a=0.5, b=0.2, step_mode="m")], ids=["soft", "izhikevich"])
def test_other_neurons_soft_reset_and_state_sequences(make) -> None:
    neuron = make()
    unfused, fused = _pair("m", "reference", _bn(4), neuron)
    x = _input(5, 2, 4, 3, 3, seed=4)
    x2 = x.detach().clone().requires_grad_()
    want, got = unfused(x), fused(x2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for name in neuron.state_names:
        torch.testing.assert_close(getattr(fused.neuron, name), getattr(neuron, name), rtol=1e-12, atol=1e-12)
    if neuron.store_v_seq:
        torch.testing.assert_close(fused.neuron.v_seq, neuron.v_seq, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(want)
    grad, = torch.autograd.grad((got * weights).sum(), x2)
    torch.testing.assert_close(grad, torch.autograd.grad((want * weights).sum(), x)[0], rtol=1e-10, atol=1e-12)


def test_pickle_round_trip() -> None:
    """The fused spec's reference is registered again on unpickling (as `Neuron` does for its own)."""
    import pickle

    layer = ann.BatchNormNeuron(4, "lif", step_mode="m", backend="reference").to(DT)
    x = _input(3, 2, 4, 3, 3, seed=5)
    want = layer(x)
    layer.reset()
    copy_ = pickle.loads(pickle.dumps(layer))
    torch.testing.assert_close(copy_(x), want, rtol=0, atol=0)


def test_state_dict_and_interface_as_batchnorm() -> None:
    layer = ann.BatchNormNeuron(8, "lif", tau=3.0, step_mode="m")
    keys = set(nn.BatchNorm2d(8).state_dict())
    assert keys <= set(layer.state_dict())
    assert layer.neuron.tau == 3.0 and layer.step_mode == "m"
    layer.step_mode = "s"  # SpikingJelly's set_step_mode sets it here: it is the neuron's
    assert layer.neuron.step_mode == "s"
    layer(torch.rand(2, 8, 3, 3))
    assert isinstance(layer.neuron.v, torch.Tensor)
    layer.reset()
    assert layer.neuron.v == 0.0


def test_track_running_stats_set_later_is_read_as_torchs_batchnorm_reads_it() -> None:
    """Set False after construction: training calls stop updating the running statistics (and counting batches),
    eval calls still use them, and reset_running_stats leaves them: as nn.BatchNorm2d, where the fused layer kept
    updating and resetting them."""
    fused = ann.BatchNormNeuron(3, ann.LIFNode(step_mode="m", backend="reference")).double()
    bn, lif = nn.BatchNorm2d(3).double(), ann.LIFNode(step_mode="m", backend="reference").double()

    def both(x: torch.Tensor) -> None:
        fused.reset(), lif.reset()
        torch.testing.assert_close(fused(x), lif(bn(x.flatten(0, 1)).view(x.shape)))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(fused, name), getattr(bn, name), msg=name)

    both(_input(4, 2, 3, 2, 2, seed=1))
    fused.track_running_stats = bn.track_running_stats = False
    both(_input(4, 2, 3, 2, 2, seed=2))
    assert int(fused.num_batches_tracked) == 1
    fused.reset_running_stats(), bn.reset_running_stats()
    fused.eval(), bn.eval()
    both(_input(4, 2, 3, 2, 2, seed=3))
    fused.track_running_stats = bn.track_running_stats = True
    fused.train(), bn.train()
    both(_input(4, 2, 3, 2, 2, seed=4))
    assert int(fused.num_batches_tracked) == 2


# ---- rewriting models ------------------------------------------------------------------------------------
def _spiking_vgg():
    """SpikingJelly's model zoo imports torchvision for its download helper only: a stand-in while importing."""
    try:
        from spikingjelly.activation_based import functional, layer
        stubs = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.models", "torchvision.models.utils")}
        stubs["torchvision.models.utils"].load_state_dict_from_url = None  # type: ignore[attr-defined]
        with mock.patch.dict(sys.modules, stubs):
            from spikingjelly.activation_based.model import spiking_vgg
    except Exception as error:  # not installed, or a dependency missing
        pytest.skip(f"SpikingJelly's model zoo does not import: {type(error).__name__}: {error}")
    return spiking_vgg, functional, layer


def test_fuse_batchnorm_on_spikingjelly_vgg11_bn() -> None:
    spiking_vgg, functional, layer = _spiking_vgg()
    torch.manual_seed(0)
    with torch.device("meta"):  # the zoo's 4096-wide head (120M weights) is not the subject: never made
        net = spiking_vgg.spiking_vgg11_bn(spiking_neuron=ann.LIFNode, num_classes=10, backend="reference")
        net.classifier = nn.Sequential(layer.Linear(512 * 7 * 7, 10))
    net = net.to_empty(device="cpu")
    for module in net.modules():  # every weight and running statistic made, then the zoo's initialisation
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    net._initialize_weights()
    net = net.to(DT)
    functional.reset_net(net)
    functional.set_step_mode(net, "m")
    fused = ann.fuse_batchnorm(copy.deepcopy(net))
    findings = ann.batchnorm_fusions(net)
    assert len(findings) == 8 and all(f.fused for f in findings)
    assert sum(isinstance(m, ann.BatchNormNeuron) for m in fused.modules()) == 8
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    assert ann.batchnorm_fusions(fused) == []
    pairs = list(zip(net.parameters(), fused.parameters()))  # same order: each BN's place moved one later
    for _ in range(2):
        x = torch.rand(2, 1, 3, 32, 32, dtype=DT)
        want, got = net(x), fused(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        want.square().sum().backward()
        got.square().sum().backward()
        for p, q in pairs:
            assert p.shape == q.shape
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-12)
        functional.reset_net(net)
        functional.reset_net(fused)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    ours = [m for m in fused.modules() if isinstance(m, ann.BatchNormNeuron)]
    for bn, layer_ in zip(bns, ours):
        torch.testing.assert_close(layer_.running_var, bn.running_var, rtol=1e-12, atol=1e-14)


class Block(nn.Module):
    """A block that calls its BatchNorm and neuron itself (bench/network.py's): T folded for conv and BN."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.conv, self.bn, self.neuron = nn.Conv2d(cin, 4, 3, padding=1), nn.BatchNorm2d(4), ann.LIFNode(step_mode="m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x.flatten(0, 1)))
        return self.neuron(y.reshape(*x.shape[:2], *y.shape[1:]))


def test_fuse_batchnorm_patterns_found_and_left() -> None:
    sj_layer = pytest.importorskip("spikingjelly.activation_based.layer")
    seq_container = sj_layer.SeqToANNContainer
    torch.manual_seed(0)
    model = nn.Sequential(
        seq_container(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)), ann.LIFNode(step_mode="m"),  # fused
        Block(4),                                                                  # only with pairs=
        seq_container(nn.BatchNorm2d(4)), nn.ReLU(),                               # left: no neuron after it
        seq_container(nn.Conv2d(4, 4, 1)),
        nn.BatchNorm2d(4), ann.LIFNode(step_mode="m"),                             # left: BN would see [T, B, ...]
        sj_layer.BatchNorm2d(4, step_mode="m"), ann.LIFNode(step_mode="m"),        # fused
        sj_layer.BatchNorm2d(4, step_mode="s"), ann.LIFNode(step_mode="m"),        # left: step modes differ
    ).to(DT)
    found = {f.path: f for f in ann.batchnorm_fusions(model)}
    assert found["0.1"].fused and found["2.bn"].reason.endswith("pass pairs=)")
    assert not found["3.0"].fused and "ReLU" in found["3.0"].reason
    assert not found["6"].fused and "[T, B, ...]" in found["6"].reason
    assert found["8"].fused and not found["10"].fused and "step modes differ" in found["10"].reason
    tail = ann.fuse_batchnorm(copy.deepcopy(model[8:10]))
    x = torch.rand(3, 2, 4, 5, 5, dtype=DT) * 3
    torch.testing.assert_close(tail(x), model[8:10](x), rtol=0, atol=0)
    declared = {f.path: f for f in ann.batchnorm_fusions(model, pairs=[("bn", "neuron")])}
    assert declared["2.bn"] == ("2.bn", True, "fused into the neuron 2.neuron")
    fused = ann.fuse_batchnorm(copy.deepcopy(model[:3]), pairs=[("bn", "neuron")])
    assert isinstance(fused[2].bn, nn.Identity) and isinstance(fused[2].neuron, ann.BatchNormNeuron)
    assert len(fused[0]) == 1  # the BatchNorm left its container
    x = torch.rand(3, 2, 2, 5, 5, dtype=DT) * 3
    torch.testing.assert_close(fused(x), model[:3](x), rtol=0, atol=0)
    with pytest.raises(TypeError, match="pairs"):
        ann.fuse_batchnorm(model, pairs=["bn"])  # type: ignore[list-item]


# ---- torch.compile and bad input -------------------------------------------------------------------------
# Dynamo's graph of the layer and AOTAutograd's trace of it (the running statistics' updates functionalised, our op's
# fake kernel) are the "aot_eager" backend's as they are Inductor's; Inductor's code for the statistics beside our
# op, compiled by the host's C++ compiler (its precompiled header first: most of a cold run's Inductor cost), runs
# with --slow. Our op inside an Inductor graph by default: tests/test_memory_order.py's
# test_compiled_fullgraph_on_channels_last_equals_eager.
COMPILER = "inductor" if profile() == "slow" else "aot_eager"


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_compiled_fullgraph_equals_eager(backend: str, host_kernels: int) -> None:
    eager = ann.BatchNormNeuron(4, ann.LIFNode(step_mode="m", backend=backend)).to(DT)
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer, fullgraph=True, backend=COMPILER)
    x = _input(3, 2, 4, 3, 3, seed=0)
    x2 = x.detach().clone().requires_grad_()
    want, got = eager(x), compiled(x2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(compiled_layer.weight.grad, eager.weight.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(compiled_layer.running_var, eager.running_var, rtol=1e-12, atol=1e-14)


def test_bad_input_is_named() -> None:
    layer = ann.BatchNormNeuron(4, "lif", step_mode="m")
    with pytest.raises(ValueError, match="expected 4 channels"):
        layer(torch.rand(2, 2, 3, 5, 5))
    with pytest.raises(ValueError, match=r"\[T, B, C, H, W\]"):
        layer(torch.rand(2, 4, 5, 5))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([1.0])
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ann.BatchNormNeuron(4, "lif")(torch.rand(1, 4, 1, 1))
    with pytest.raises(ValueError, match="num_features"):
        ann.BatchNormNeuron(0)
    with pytest.raises(ValueError, match="dims"):
        ann.BatchNormNeuron(4, dims=4)
    with pytest.raises(TypeError, match="neuron"):
        ann.BatchNormNeuron(4, nn.ReLU())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="neuron_args"):
        ann.BatchNormNeuron(4, ann.LIFNode(), tau=3.0)
    with pytest.raises(ValueError, match="step_mode"):
        layer.step_mode = "x"
