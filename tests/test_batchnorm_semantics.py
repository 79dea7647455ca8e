"""The fused BatchNorm layer's semantics against the unfused model it replaces (torch's BatchNorm1d/2d/3d, or
SpikingJelly's multi-step layer.BatchNorm2d, then the same neuron), in float64 on the generated kernels through the
host runner: spikes, states, the gradients of x, BatchNorm's weight and bias and the neuron's parameters, and the
running statistics after each training call; under mode switches, BatchNorm's options and settings changed after
construction, awkward inputs, the neuron's options, checkpoints, lower precisions, and `fuse_batchnorm`.

Faults found here and pinned: `from_batchnorm` (so `fuse_batchnorm`) failed with a KeyError on a BatchNorm whose
`track_running_stats` was set False after construction, and gave running statistics to one built without them
whose flag was set True later; `fuse_batchnorm` fused a BatchNorm with hooks (never run again), with
parametrizations (torch's TypeError) or of a subclass overriding forward (bypassed); eps <= 0 with batch statistics
(torch refuses it) and a weight, bias or running statistic replaced by one of another size (broadcast over the
channels in eval) were taken; an empty batch, which torch's BatchNorm passes through, was refused as having "more
than 1 value per channel" to find."""
from __future__ import annotations

import copy

import pytest
import torch
from backends import NEEDS_HOST
from conftest import profile
from torch import nn

import autocuda.nn as ann

pytestmark = NEEDS_HOST
DT = torch.float64
KINDS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
SLOW = pytest.mark.skipif(profile() != "slow", reason="wider sweep: --slow")


def _input(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DT) * 2 + 0.5


def _bn(channels: int = 4, dims: int = 2, **kwargs) -> nn.Module:
    bn = KINDS[dims](channels, **kwargs).to(DT)
    if bn.weight is not None:
        g = torch.Generator().manual_seed(channels)
        with torch.no_grad():
            bn.weight.copy_(torch.rand(channels, generator=g, dtype=DT) + 0.5)
            bn.bias.copy_(torch.rand(channels, generator=g, dtype=DT) - 0.5)
    return bn


def _plif(mode: str = "m") -> ann.Neuron:
    return ann.ParametricLIFNode(step_mode=mode, backend="host").to(DT)


class Pair:
    """The unfused model (BatchNorm, then the neuron: T folded into the batch in step mode 'm') and the fused layer
    made from copies of both; `call` runs both on x and checks spikes and states alike, `backward` the gradients
    of everything given since the last backward, `buffers` the running statistics."""

    def __init__(self, bn: nn.Module, neuron: ann.Neuron, mode: str = "m") -> None:
        self.bn, self.neuron, self.mode = bn, neuron, mode
        self.fused = ann.BatchNormNeuron.from_batchnorm(copy.deepcopy(bn), copy.deepcopy(neuron))
        self._inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._losses: list[tuple[torch.Tensor, torch.Tensor]] = []

    def unfused(self, x: torch.Tensor) -> torch.Tensor:
        return self.neuron(self.bn(x.flatten(0, 1)).view(x.shape) if self.mode == "m" else self.bn(x))

    def call(self, x: torch.Tensor, final_states: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        want, got = self.unfused(a), self.fused(b)
        assert torch.equal(got, want), f"{int((got != want).sum())} spikes differ"
        for name in self.neuron.state_names:
            torch.testing.assert_close(getattr(self.fused.neuron, name), getattr(self.neuron, name),
                                       rtol=1e-12, atol=1e-12)
        weights = torch.linspace(0.5, 1.5, want.numel(), dtype=DT).view(want.shape)
        loss = [(want * weights).sum(), (got * weights).sum()]
        if final_states:  # the final membrane's gradient too
            loss[0] = loss[0] + 1.3 * self.neuron.v.sum()
            loss[1] = loss[1] + 1.3 * self.fused.neuron.v.sum()
        self._inputs.append((a, b))
        self._losses.append((loss[0], loss[1]))
        self.buffers()
        return want, got

    def backward(self) -> None:
        theirs = [p for p in [*self.bn.parameters(), *self.neuron.parameters()] if p.requires_grad]
        ours = [p for p in self.fused.parameters() if p.requires_grad]
        assert len(ours) == len(theirs)
        if any(loss.requires_grad for loss, _ in self._losses):
            want = torch.autograd.grad(sum(w for w, _ in self._losses), [a for a, _ in self._inputs] + theirs,
                                       allow_unused=True, materialize_grads=True)
            got = torch.autograd.grad(sum(g for _, g in self._losses), [b for _, b in self._inputs] + ours,
                                      allow_unused=True, materialize_grads=True)
            for i, (g, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m, i=i: f"gradient {i}: {m}")
        self._inputs, self._losses = [], []
        self.neuron.reset()
        self.fused.reset()

    def buffers(self) -> None:
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            want, got = getattr(self.bn, name, None), getattr(self.fused, name, None)
            assert (want is None) == (got is None), name
            if want is not None:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=name)


def _steps(pair: Pair, shape: tuple[int, ...], calls: int = 2, per_backward: int = 1, final_states: bool = False,
           before=None) -> None:
    for i in range(calls):
        if before is not None:
            before(i, pair.bn, pair.fused)
        pair.call(_input(*shape, seed=i), final_states)
        if (i + 1) % per_backward == 0 or i == calls - 1:
            pair.backward()


# ---- faults found -----------------------------------------------------------------------------------------------
def test_from_batchnorm_takes_the_buffers_bn_has_whatever_its_track_running_stats_says() -> None:
    """track_running_stats set False after construction: bn keeps its buffers (eval reads them), and
    from_batchnorm raised KeyError "attribute 'running_mean' already exists". Built without them and set True
    later: bn has none (eval takes batch statistics), and the fused layer made fresh ones (float32 zeros and ones)
    that eval then read."""
    for built, later in ((True, False), (False, True)):
        bn = _bn(track_running_stats=built)
        bn.track_running_stats = later
        pair = Pair(bn, _plif())
        assert pair.fused.track_running_stats == later
        _steps(pair, (3, 2, 4, 3, 3))
        pair.bn.eval(), pair.fused.eval()
        _steps(pair, (3, 2, 4, 3, 3))


def test_fuse_batchnorm_leaves_what_the_fused_layer_would_not_do() -> None:
    """A BatchNorm with hooks (they never ran again), with parametrizations (torch's TypeError "cannot assign
    'torch.DoubleTensor' as parameter 'weight'") or of a subclass overriding forward (bypassed) was fused; now left,
    each with its reason. SpikingJelly's layer.BatchNorm2d (its own forward) is still fused; its tdBN and TEBN are
    no BatchNorm2d and are left."""
    import torch.nn.utils.parametrize as parametrize

    class Doubled(nn.BatchNorm2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    class Square(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w * w

    hooked, pre, parametrized = nn.BatchNorm2d(4), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
    ran = []
    hooked.register_forward_hook(lambda *args: ran.append(1))
    pre.register_forward_pre_hook(lambda *args: None)
    parametrize.register_parametrization(parametrized, "weight", Square())
    cases = {"hooks": hooked, "hooks ": pre, "parametrizations": parametrized, "overrides forward": Doubled(4)}
    for reason, bn in cases.items():
        model = nn.Sequential(bn, ann.LIFNode(step_mode="s"))
        finding, = ann.batchnorm_fusions(model)
        assert not finding.fused and reason.strip() in finding.reason, finding
        ann.fuse_batchnorm(model)
        assert model[0] is bn and isinstance(model[1], ann.LIFNode)
        declared = nn.Module()
        declared.bn, declared.neuron = bn, ann.LIFNode(step_mode="s")
        finding, = ann.batchnorm_fusions(declared, pairs=[("bn", "neuron")])
        assert not finding.fused and reason.strip() in finding.reason
    model[0](torch.rand(2, 4, 3, 3))
    layer = pytest.importorskip("spikingjelly.activation_based.layer")
    model = nn.Sequential(layer.BatchNorm2d(4, step_mode="m"), ann.LIFNode(step_mode="m"),
                          layer.ThresholdDependentBatchNorm2d(1.0, 1.0, 4), ann.LIFNode(step_mode="m"),
                          layer.TemporalEffectiveBatchNorm2d(3, 4), ann.LIFNode(step_mode="m"))
    assert [f.fused for f in ann.batchnorm_fusions(model)] == [True, False, False]


@pytest.mark.parametrize("mode", ["m", "s"])
def test_eps_is_checked_at_each_call_as_torchs_batchnorm_checks_it(mode: str) -> None:
    """eps <= 0 with batch statistics (torch: "batch_norm eps must be positive during training") and eps < 0 with
    running ones were taken: a zero-variance channel gave inf, a negative eps NaN, without a word."""
    layer = ann.BatchNormNeuron(4, "lif", eps=0.0, step_mode=mode, backend="host").to(DT)
    x = _input(3, 2, 4, 3, 3)[0 if mode == "s" else slice(None)]
    with pytest.raises(ValueError, match="^eps: expected a positive number"):
        layer(x)
    layer.eval()
    assert layer(x).shape == x.shape  # eval: the running statistics (torch takes eps = 0 there)
    layer.eps = -1.0
    with pytest.raises(ValueError, match="^eps: expected a non-negative number"):
        layer(x)
    layer.track_running_stats = False
    layer.running_mean = layer.running_var = layer.num_batches_tracked = None  # batch statistics in eval
    layer.eps = 0.0
    with pytest.raises(ValueError, match="^eps: expected a positive number"):
        layer(x)


@pytest.mark.parametrize("name", ["weight", "bias", "running_mean", "running_var"])
def test_a_parameter_or_running_statistic_of_another_size_is_refused(name: str) -> None:
    """Replaced after construction by one value (torch's BatchNorm: "weight should contain 4 elements not 1"): eval
    broadcast it over every channel, training failed inside a reshape ("shape '[4, 1, 1]' is invalid")."""
    layer = ann.BatchNormNeuron(4, "lif", step_mode="m", backend="host").to(DT)
    value = torch.full((1,), 0.5, dtype=DT)
    setattr(layer, name, nn.Parameter(value) if name in ("weight", "bias") else value)
    x = _input(3, 2, 4, 3, 3)
    for training in (True, False):
        layer.train(training)
        with pytest.raises(ValueError, match=rf"^{name}: expected 4 values \(one per channel\), got shape \(1,\)"):
            layer(x)
    if name.startswith("running"):  # training without tracking neither reads nor updates them (as torch)
        layer.train()
        layer.track_running_stats = False
        assert layer(x).shape == x.shape


@pytest.mark.parametrize(("mode", "shape"), [("m", (3, 0, 4, 3, 3)), ("s", (0, 4, 3, 3))])
def test_an_empty_batch_passes_through_as_in_torchs_batchnorm(mode: str, shape: tuple[int, ...]) -> None:
    """torch's BatchNorm passes an empty batch through in training (counting it, the running statistics
    unchanged, zero gradients for weight and bias); the fused layer refused it as having "more than 1 value per
    channel" to find."""
    pair = Pair(_bn(), _plif(mode), mode)
    want, got = pair.call(_input(*shape))
    assert got.shape == shape and int(pair.fused.num_batches_tracked) == 1
    pair.backward()  # x's (empty), weight's and bias's (zeros) and the neuron's gradients as the unfused pair's


# ---- what was checked and held ----------------------------------------------------------------------------------
CASES = [  # (step mode, BatchNorm dims, its options, x's shape)
    ("m", 2, {}, (3, 2, 4, 3, 3)),
    ("m", 2, {"momentum": None}, (3, 2, 4, 3, 3)),
    ("m", 2, {"momentum": 0.7, "eps": 1e-2}, (1, 2, 4, 3, 3)),   # T = 1
    ("m", 2, {"affine": False}, (3, 2, 4, 3, 3)),
    ("m", 2, {"track_running_stats": False}, (3, 2, 4, 3, 3)),
    ("m", 1, {}, (3, 5, 4)),
    ("s", 2, {"momentum": None}, (2, 4, 3, 3)),
]
SLOW_CASES = [
    ("m", 1, {"momentum": None}, (3, 2, 4, 5)), ("m", 3, {}, (2, 2, 4, 2, 2, 3)), ("s", 1, {}, (5, 4)),
    ("s", 2, {"affine": False, "momentum": 0.5}, (3, 4, 2, 2)), ("s", 2, {"track_running_stats": False}, (2, 4, 3, 3)),
    ("m", 3, {"eps": 0.5, "momentum": None}, (1, 3, 4, 2, 2, 2)),
]


def _options(mode: str, dims: int, kwargs: dict, shape: tuple[int, ...]) -> None:
    pair = Pair(_bn(4, dims, **kwargs), _plif(mode), mode)
    _steps(pair, shape, calls=2)
    _steps(pair, shape, calls=2, per_backward=2, final_states=True)  # two calls, then one backward
    pair.bn.eval(), pair.fused.eval()
    _steps(pair, shape, calls=1)


@pytest.mark.parametrize(("mode", "dims", "kwargs", "shape"), CASES)
def test_options_train_eval_against_the_unfused_pair(mode: str, dims: int, kwargs: dict,
                                                     shape: tuple[int, ...]) -> None:
    _options(mode, dims, kwargs, shape)


@SLOW
@pytest.mark.parametrize(("mode", "dims", "kwargs", "shape"), SLOW_CASES)
def test_options_train_eval_against_the_unfused_pair_wider(mode: str, dims: int, kwargs: dict,
                                                           shape: tuple[int, ...]) -> None:
    _options(mode, dims, kwargs, shape)


def test_settings_changed_between_calls_take_effect() -> None:
    """Mode switches, and eps, momentum, weight, bias and running statistics changed in place or replaced."""
    def change(i: int, bn: nn.Module, fused: nn.Module) -> None:
        with torch.no_grad():
            if i == 1:
                for m in (bn, fused):
                    m.weight.mul_(1.5), m.bias.add_(0.2), m.running_mean.add_(0.3), m.running_var.mul_(2)
                    m.eps, m.momentum = 0.3, 0.5
            if i == 2:
                for m in (bn, fused):
                    m.eval()
                    m.running_mean.add_(0.3), m.running_var.mul_(2)
            if i == 3:
                for m in (bn, fused):
                    m.train()
                    m.weight = nn.Parameter(torch.full((4,), 2.0, dtype=DT))
                    m.running_var = torch.full((4,), 3.0, dtype=DT)
                    m.momentum = None
            if i == 4:
                for m in (bn, fused):
                    m.eval()
                    m.weight.requires_grad_(False)

    _steps(Pair(_bn(), _plif()), (3, 2, 4, 3, 3), calls=5, before=change)


def _constant_channel(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[..., 1, :, :] = 0.7
    return x


@pytest.mark.parametrize("form", ["zero variance", "channels_last", "strided", "transposed"])
def test_awkward_inputs(form: str) -> None:
    pair = Pair(_bn(), _plif())
    x = _input(3, 2, 4, 3, 6)
    x = {"zero variance": lambda: _constant_channel(x),
         "channels_last": lambda: x.contiguous(memory_format=torch.channels_last_3d),
         "strided": lambda: x[..., ::2], "transposed": lambda: x.transpose(0, 1)}[form]()
    # `call` clones (keeping a dense layout); a strided x is given as is
    a, b = x.detach().requires_grad_(), x.detach().clone().requires_grad_()
    if form == "strided":
        base = _input(3, 2, 4, 3, 6).requires_grad_()
        base2 = base.detach().clone().requires_grad_()
        a, b = base[..., ::2], base2[..., ::2]
    want, got = pair.unfused(a), pair.fused(b)
    assert torch.equal(got, want)
    pair.buffers()
    weights = torch.linspace(0.5, 1.5, want.numel(), dtype=DT).view(want.shape)
    leaves = [a if form != "strided" else base, pair.bn.weight, pair.bn.bias, pair.neuron.w]
    ours = [b if form != "strided" else base2, pair.fused.weight, pair.fused.bias, pair.fused.neuron.w]
    for g, w in zip(torch.autograd.grad((got * weights).sum(), ours), torch.autograd.grad((want * weights).sum(),
                                                                                         leaves)):
        # a constant channel's weight gradient is rounding (x - mean ~ 1e-16) scaled by 1/sqrt(eps) ~ 316
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10 if form == "zero variance" else 1e-12)


def test_one_value_per_channel_is_refused_where_torch_refuses_it() -> None:
    for mode, x in (("s", _input(1, 4, 1, 1)), ("m", _input(1, 1, 4, 1, 1))):
        layer = ann.BatchNormNeuron(4, "lif", step_mode=mode, backend="host").to(DT)
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            layer(x)
        layer.eval()  # running statistics: taken
        assert layer(x).shape == x.shape
        layer = ann.BatchNormNeuron(4, "lif", step_mode=mode, backend="host", track_running_stats=False).to(DT)
        layer.eval()  # no running statistics: batch ones in eval too
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            layer(x)
    assert ann.BatchNormNeuron(4, "lif", step_mode="m", backend="host").to(DT)(_input(4, 1, 4, 1, 1)).shape[0] == 4


@pytest.mark.parametrize("option", ["recompute", "save_h", "store_v_seq", "frozen bn", "frozen w",
                                    "final states off", "soft detached"])
def test_neuron_options_and_frozen_parameters(option: str) -> None:
    bn, neuron = _bn(), _plif()
    if option == "recompute":
        neuron.recompute = True
    elif option == "save_h":
        neuron.save_h = False
    elif option == "store_v_seq":
        neuron.store_v_seq = True
    elif option == "frozen bn":
        bn.weight.requires_grad_(False), bn.bias.requires_grad_(False)
    elif option == "frozen w":
        neuron.w.requires_grad_(False)
    elif option == "final states off":
        neuron.store_final_states = False
    else:
        neuron.v_reset, neuron.detach_reset = None, True
    pair = Pair(bn, neuron)
    _steps(pair, (3, 2, 4, 3, 3), calls=2, per_backward=2, final_states=option != "final states off")
    if option == "store_v_seq":
        pair.call(_input(3, 2, 4, 3, 3, seed=5))
        torch.testing.assert_close(pair.fused.neuron.v_seq, pair.neuron.v_seq, rtol=1e-12, atol=1e-12)


def test_neuron_hooks_see_batchnorms_output() -> None:
    pair = Pair(_bn(), _plif())
    seen = []
    pair.fused.neuron.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    x = _input(3, 2, 4, 3, 3)
    pair.call(x)
    pair.backward()
    reference = copy.deepcopy(pair.bn)
    reference.running_mean.zero_(), reference.running_var.fill_(1), reference.num_batches_tracked.zero_()
    torch.testing.assert_close(seen[0], reference(x.flatten(0, 1)).view(x.shape), rtol=1e-12, atol=1e-12)


def test_checkpoints_round_trip_with_the_unfused_pair_and_deepcopy() -> None:
    pair = Pair(_bn(), _plif())
    _steps(pair, (3, 2, 4, 3, 3), calls=2)
    state = pair.fused.state_dict()
    bn, neuron = nn.BatchNorm2d(4).to(DT), _plif()
    bn.load_state_dict({k: v for k, v in state.items() if not k.startswith("neuron.")})
    neuron.load_state_dict({k[len("neuron."):]: v for k, v in state.items() if k.startswith("neuron.")})
    back = ann.BatchNormNeuron(4, _plif()).to(DT)
    back.load_state_dict({**bn.state_dict(), **{f"neuron.{k}": v for k, v in neuron.state_dict().items()}})
    twin = copy.deepcopy(pair.fused)
    assert twin.running_mean is not pair.fused.running_mean and twin.weight is not pair.fused.weight
    x = _input(3, 2, 4, 3, 3, seed=9)
    for training in (False, True):
        outputs = []
        for layer in (back, twin, pair.fused):
            layer.train(training)
            layer.reset()
            outputs.append(layer(x))
        bn.train(training)
        neuron.reset()
        want = neuron(bn(x.flatten(0, 1)).view(x.shape))
        assert all(torch.equal(out, want) for out in outputs)
        for layer in (back, twin, pair.fused):
            torch.testing.assert_close(layer.running_var, bn.running_var, rtol=1e-12, atol=1e-14)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@pytest.mark.parametrize(("dtype", "spikes", "tol"), [(torch.float32, 1e-3, 1e-5), (torch.bfloat16, 2e-3, 2e-2)],
                         ids=str)
def test_lower_precisions_are_near_float64(dtype: torch.dtype, spikes: float, tol: float) -> None:
    """The fused layer in float32 (two backward passes) and bfloat16 (one, h saved) against the float64 pair: no
    farther than the unfused pair in that dtype is (twice its error, or `tol`): in bfloat16 a few flipped spikes
    move the final membrane and the neuron's parameter's gradient by some percent in both."""
    bn, neuron = _bn(8), _plif()
    x, weights = _input(4, 4, 8, 6, 6, seed=1), torch.randn(4, 4, 8, 6, 6, dtype=DT,
                                                             generator=torch.Generator().manual_seed(2))
    results = []
    for kind, fuse in ((DT, False), (dtype, False), (dtype, True)):
        pair = Pair(copy.deepcopy(bn).to(kind), copy.deepcopy(neuron).to(kind))
        layer = pair.fused if fuse else pair.unfused
        bn_, neuron_ = (pair.fused, pair.fused.neuron) if fuse else (pair.bn, pair.neuron)
        given = x.to(kind).detach().requires_grad_()
        out = layer(given)
        (out * weights.to(kind)).sum().backward()
        results.append((out, given.grad, bn_.weight.grad, bn_.bias.grad, neuron_.w.grad, bn_.running_mean,
                        bn_.running_var, neuron_.v))
    (exact, *exact_rest), (unfused, *unfused_rest), (fused, *fused_rest) = results
    assert fused.dtype == dtype
    assert float((fused.double() != exact).double().mean()) <= max(2 * float((unfused.double() != exact).double()
                                                                              .mean()), spikes)
    for ours, theirs, want in zip(fused_rest, unfused_rest, exact_rest):
        assert _relative(ours, want) <= max(2 * _relative(theirs, want), tol)


def _sj_model(kind: str, mode: str, bn_args: dict) -> nn.Module:
    layer = pytest.importorskip("spikingjelly.activation_based.layer")
    torch.manual_seed(0)
    if kind == "sj":
        model = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1, step_mode=mode),
                              layer.BatchNorm2d(4, step_mode=mode, **bn_args), _plif(mode),
                              layer.Conv2d(4, 4, 3, padding=1, step_mode=mode),
                              layer.BatchNorm2d(4, step_mode=mode, **bn_args),
                              ann.LIFNode(step_mode=mode, backend="host"))
    elif kind == "container":
        model = nn.Sequential(layer.SeqToANNContainer(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, **bn_args)),
                              _plif("m"))
    else:
        model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, **bn_args), _plif("s"))
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d) and module.weight is not None:
            with torch.no_grad():
                module.weight.uniform_(0.5, 1.5), module.bias.uniform_(-0.5, 0.5)
    return model.to(DT)


FUSE_CASES = [("sj", "m", {"momentum": None}), ("sj", "s", {"momentum": 0.5, "eps": 1e-3}),
              ("container", "m", {"affine": False}), ("torch", "s", {"track_running_stats": False})]
SLOW_FUSE = [(kind, mode, args) for kind, mode in (("sj", "m"), ("sj", "s"), ("container", "m"), ("torch", "s"))
             for args in ({}, {"momentum": None}, {"momentum": 0.5, "eps": 1e-3}, {"affine": False},
                          {"track_running_stats": False})]


def _fused_model(kind: str, mode: str, bn_args: dict) -> None:
    functional = pytest.importorskip("spikingjelly.activation_based.functional",
                                     reason="SpikingJelly's networks and functional.reset_net")

    model = _sj_model(kind, mode, bn_args)
    fused = ann.fuse_batchnorm(copy.deepcopy(model))
    assert all(f.fused for f in ann.batchnorm_fusions(model))
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    layers = [m for m in fused.modules() if isinstance(m, ann.BatchNormNeuron)]
    assert len(bns) == len(layers) > 0
    for bn, layer in zip(bns, layers):
        assert (layer.eps, layer.momentum, layer.affine, layer.track_running_stats) == \
            (bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    for step in range(3):
        if step == 2:
            model.eval(), fused.eval()
        x = _input(3, 2, 2, 5, 5, seed=step)
        outputs = []
        for net in (model, fused):
            functional.reset_net(net)
            out = net(x) if mode == "m" else torch.stack([net(s) for s in x])
            outputs.append(out)
            if net.training:
                (out * torch.linspace(0, 1, out.numel(), dtype=DT).view(out.shape)).sum().backward()
        assert torch.equal(outputs[1], outputs[0])
        for p, q in zip(model.parameters(), fused.parameters()):
            if p.grad is not None or q.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-12)
        for bn, layer in zip(bns, layers):
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                want, got = getattr(bn, name), getattr(layer, name)
                assert (want is None) == (got is None)
                if want is not None:
                    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("kind", "mode", "bn_args"), FUSE_CASES)
def test_fuse_batchnorm_with_batchnorm_options(kind: str, mode: str, bn_args: dict) -> None:
    _fused_model(kind, mode, bn_args)


@SLOW
@pytest.mark.parametrize(("kind", "mode", "bn_args"), SLOW_FUSE)
def test_fuse_batchnorm_with_batchnorm_options_wider(kind: str, mode: str, bn_args: dict) -> None:
    _fused_model(kind, mode, bn_args)
