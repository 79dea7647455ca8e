"""A BPTT kernel in two passes (`gradients="sums"`, then `"corrected"`), a BatchNorm's backward: the first stores
the per-channel sums alone, the second every other gradient, the input's with c1[c] * x + c0[c] added. Together
they give what one kernel gives, that term added."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched, profile

from autocuda.codegen.broadcast import PER_CHANNEL
from autocuda.codegen.kernels import neuron_kernel
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import load_spec
from autocuda.spec.transform import INPUT_SCALE, INPUT_SHIFT, with_input_affine
from autocuda.tools.testing.named_launch import backward, forward

T, B, C, INNER = 11, 3, 4, 5
N = B * C * INNER


NAMES = ["lif", "parametric_lif", "izhikevich"]
OTHER_CALLS = ["bfloat16", "recompute", "store_v_seq", "eval", "no_grad", "channels_last", "reference",
               "frozen_affine", "deterministic"]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels the eager tests below launch, compiled up front many to a compiler run
    (`conftest.compile_launched`); the tests would compile them one kernel a run."""
    def fused(name: str, one_pass: bool) -> None:
        from autocuda.nn.batchnorm import BatchNormNeuron

        with pytest.MonkeyPatch.context() as patch:
            if one_pass:
                patch.setattr(BatchNormNeuron, "_two_passes_fit", lambda self, x: False)
            _train(_layer(name), torch.randn(*FUSED_SHAPE, dtype=torch.float64) + 0.8)

    calls = [functools.partial(_two_passes, name, replay) for name in NAMES for replay in (False, True)]
    calls += [functools.partial(fused, name, one_pass) for name in NAMES for one_pass in (False, True)]
    calls += [functools.partial(_other_call, case) for case in OTHER_CALLS]
    return compile_launched(*calls, _keeps_nothing_of_xs_size_but_x)


def _two_passes(name: str, replay_charge: bool) -> tuple:
    """One BPTT kernel's gradients, the two passes' (sums, then the rest with the term) and what they read."""
    spec = with_input_affine(load_spec(name))
    shared = tuple((p.name, False) for p in spec.params
                   if p.kind == "tensor" and p.name not in (INPUT_SCALE, INPUT_SHIFT))
    tensors = ((INPUT_SCALE, PER_CHANNEL), (INPUT_SHIFT, PER_CHANNEL), *shared)
    config = NeuronConfig(spec, spec.surrogate, spec.reset, tensors=tensors, replay_charge=replay_charge)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, N, generator=gen, dtype=torch.float64) + 0.8
    params = {p.name: p.default for p in spec.params}
    params |= {name: torch.tensor([float(params[name])], dtype=torch.float64) for name, _ in shared}
    params |= {INPUT_SCALE: torch.rand(C, dtype=torch.float64) + 0.5,
               INPUT_SHIFT: torch.rand(C, dtype=torch.float64) * 0.3, "ac_channels": C, "ac_inner": INNER}
    init = {s.name: torch.rand(N, generator=gen, dtype=torch.float64) * 0.5 for s in spec.states}
    out = forward(config, x, init, params, backend="host")
    grads = {"grad_spike_seq": torch.randn(T, N, generator=gen, dtype=torch.float64),
             **{f"grad_{s.name}_final": torch.randn(N, generator=gen, dtype=torch.float64) for s in spec.states}}
    saved = {**out, **{f"{k}_init": v for k, v in init.items()}, "x_seq": x}
    one = backward(config, grads, saved, params, backend="host")
    sums = backward(config, grads, saved, params, backend="host", gradients="sums")
    c1, c0 = torch.randn(C, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    terms = {"ac_grad_x_scale": c1, "ac_grad_x_shift": c0}
    rest = backward(config, grads, saved, params | terms, backend="host", gradients="corrected")
    return out, one, sums, rest, x, c1, c0


@pytest.mark.parametrize("replay_charge", [False, True], ids=["h-saved", "h-replayed"])
@pytest.mark.parametrize("name", NAMES)
def test_two_passes_give_one_kernels_gradients_and_the_term(name, replay_charge):
    out, one, sums, rest, x, c1, c0 = _two_passes(name, replay_charge)
    assert out["spike_seq"].sum() > 0
    channel_grads = {f"grad_{INPUT_SCALE}", f"grad_{INPUT_SHIFT}"}
    assert set(sums) == channel_grads and not set(rest) & channel_grads
    assert set(sums) | set(rest) == set(one)
    for key in channel_grads:
        torch.testing.assert_close(sums[key], one[key], rtol=1e-12, atol=1e-12)
    channel = (torch.arange(N) // INNER) % C
    torch.testing.assert_close(rest["grad_x_seq"], one["grad_x_seq"] + c1[channel] * x + c0[channel], rtol=1e-12,
                               atol=1e-12)
    for key in set(rest) - {"grad_x_seq"}:
        assert torch.equal(rest[key], one[key]), key


def test_passes_need_bptt_with_per_channel_parameters():
    spec = with_input_affine(load_spec("lif"))
    channel = {"tensors": [INPUT_SCALE, INPUT_SHIFT], "per_channel": [INPUT_SCALE, INPUT_SHIFT]}
    with pytest.raises(ValueError, match="a BPTT kernel with per-channel parameters only"):
        neuron_kernel(spec, "bptt", "float32", gradients="sums")
    with pytest.raises(ValueError, match="a BPTT kernel with per-channel parameters only"):
        neuron_kernel(spec, "step-backward", "float32", gradients="corrected", **channel)
    with pytest.raises(ValueError, match="gradients: expected one of"):
        neuron_kernel(spec, "bptt", "float32", gradients="some", **channel)
    assert neuron_kernel(spec, "bptt", "float32", **channel).kernel_name == \
        neuron_kernel(spec, "bptt", "float32", gradients="all", **channel).kernel_name


# -- the fused BatchNorm layer's training call in two passes (`nn.batchnorm_passes`) ------------------------
def _layer(name: str, dtype=torch.float64, **neuron):
    import autocuda.nn as ann

    torch.manual_seed(2)
    layer = ann.BatchNormNeuron(4, ann.Neuron(name, step_mode="m", backend="host", **neuron)).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.3, 0.3)
    return layer


def _spy(monkeypatch) -> list:
    from autocuda.nn import batchnorm_passes

    calls = []
    original = batchnorm_passes.two_passes
    monkeypatch.setattr(batchnorm_passes, "two_passes", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def _train(layer, x: torch.Tensor, calls: int = 2) -> tuple:
    inp = x.clone().requires_grad_(True)
    for _ in range(calls):  # the second call starts from the states the first kept (tensors)
        spikes = layer(inp)
        (spikes * torch.linspace(-1, 1, spikes.numel(), dtype=spikes.dtype).reshape(spikes.shape)).sum().backward()
        for state in layer.neuron.state_names:
            setattr(layer.neuron, state, getattr(layer.neuron, state).detach())
    grads = {k: v.grad.clone() for k, v in layer.named_parameters()}
    return spikes.detach(), inp.grad, grads, layer.running_mean.clone(), layer.running_var.clone()


FUSED_SHAPE = (5, 3, 4, 6, 7)


@pytest.mark.parametrize("name", NAMES)
def test_fused_layer_in_two_passes_equals_one_pass(name, monkeypatch):
    import copy

    from autocuda.nn.batchnorm import BatchNormNeuron

    layer = _layer(name)
    one_pass = copy.deepcopy(layer)
    x = torch.randn(*FUSED_SHAPE, dtype=torch.float64) + 0.8
    calls = _spy(monkeypatch)
    got = _train(layer, x)
    assert len(calls) == 2
    monkeypatch.setattr(BatchNormNeuron, "_two_passes_fit", lambda self, x: False)
    want = _train(one_pass, x)
    assert len(calls) == 2 and torch.equal(got[0], want[0]) and got[0].sum() > 0
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)
    assert got[2].keys() == want[2].keys()
    for key in want[2]:
        torch.testing.assert_close(got[2][key], want[2][key], rtol=1e-10, atol=1e-12, msg=key)
    for a, b in zip(got[3:], want[3:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _keeps_nothing_of_xs_size_but_x() -> tuple:
    layer = _layer("lif")
    x = (torch.randn(4, 2, 4, 5, 5, dtype=torch.float64) + 1).requires_grad_(True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        layer(x)
    return x, kept


def test_fused_layer_in_two_passes_keeps_nothing_of_xs_size_but_x():
    x, kept = _keeps_nothing_of_xs_size_but_x()
    large = {t.data_ptr() for t in kept if t.numel() >= x.numel()}
    assert large == {x.data_ptr()}


# By default the dynamic compile, whose symbolic sizes are the harder case; the static compile of the fused layer's
# two passes is also test_batchnorm's test_compiled_fullgraph_equals_eager. The kernel's T is a constant of the
# graph (a new T compiles it again), so by default both shapes share one T, of the loop kernels (test_batchnorm
# compiles a T below 8, a replaying kernel); --slow adds a replaying T here too.
COMPILED_SHAPES = ((10, 3, 4, 6, 7), (10, 2, 4, 3, 5), *([(4, 3, 4, 6, 7)] if profile() == "slow" else []))
# What this checks is how the two passes' ops meet the compiler: Dynamo's graph without a break, their fake kernels
# under symbolic sizes, AOTAutograd's forward and backward (with Inductor's partitioner) through them. aot_eager
# traces all of that and runs the graphs as traced; Inductor would add the C++ it generates and compiles for the
# ops around them (seconds per graph): --slow compiles with Inductor, and the default run meets Inductor with the
# fused layer in test_batchnorm's test_compiled_fullgraph_equals_eager.
COMPILER = "inductor" if profile() == "slow" else "aot_eager"


@pytest.mark.parametrize("dynamic", [True] + ([False] if profile() == "slow" else []),
                         ids=lambda dynamic: "dynamic" if dynamic else "static")
def test_fused_layer_in_two_passes_compiles(dynamic, monkeypatch):
    """The fused layer's training call in two passes, compiled whole (fullgraph; aot_eager by default, Inductor with
    --slow: see COMPILER), equals the eager layer: spikes, x's and the parameters' gradients."""
    import copy

    layer = _layer("parametric_lif")
    other = copy.deepcopy(layer)
    compiled = torch.compile(other, fullgraph=True, dynamic=dynamic, backend=COMPILER)
    calls = _spy(monkeypatch)
    for shape in COMPILED_SHAPES:
        x = torch.randn(*shape, dtype=torch.float64) + 0.8
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        layer.reset()
        other.reset()
        want, got = layer(a), compiled(b)
        assert torch.equal(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(other.weight.grad, layer.weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(other.neuron.w.grad, layer.neuron.w.grad, rtol=1e-10, atol=1e-10)
    assert calls, "the eager layer took the two passes"


@pytest.mark.parametrize("case", OTHER_CALLS)
def test_other_calls_take_one_pass(case, monkeypatch):
    calls = _spy(monkeypatch)
    _other_call(case)
    assert not calls


def _other_call(case: str) -> None:
    """The fused layer's call of `case` (test_other_calls_take_one_pass)."""
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float64
    neuron = {"recompute": True} if case == "recompute" else {"store_v_seq": True} if case == "store_v_seq" \
        else {"backend": "torch"} if case == "reference" else {}
    if case == "reference":
        import autocuda.nn as ann

        layer = ann.BatchNormNeuron(4, ann.Neuron("lif", step_mode="m", **neuron)).to(dtype)
    else:
        layer = _layer("lif", dtype, **neuron)
    if case == "eval":
        layer.eval()
    if case == "frozen_affine":
        layer.weight.requires_grad_(False)
    x = (torch.randn(4, 2, 4, 5, 5) + 1).to(dtype)
    if case == "channels_last":
        x = x.reshape(8, 4, 5, 5).contiguous(memory_format=torch.channels_last).reshape(4, 2, 4, 5, 5)
    x.requires_grad_(case != "no_grad")
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(case == "deterministic")
    try:
        with torch.set_grad_enabled(case != "no_grad"):
            layer(x)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_two_passes_refuse_one_value_per_channel():
    layer = _layer("lif")
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(torch.randn(1, 1, 4, 1, 1, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("numbers", [False, True], ids=["tensor-states", "number-states"])
def test_opcheck_backward_passes(numbers):
    """`autocuda::neuron_backward_part`: schema, fake kernel (shapes and dtypes of what each pass returns) and the
    implementation agree (`torch.library.opcheck`)."""
    from autocuda.call import ops
    from autocuda.codegen.broadcast import CHANNEL_KEYS
    from autocuda.runtime.configs import get_config

    spec = with_input_affine(load_spec("parametric_lif"))
    signature = ((INPUT_SCALE, PER_CHANNEL, True), (INPUT_SHIFT, PER_CHANNEL, True), ("w", False, True))
    key = get_config(spec, None, None, False, (), signature, True, replay_charge=True).key
    e = ops.entry(key)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, N, generator=gen, dtype=torch.float64) + 0.8
    states = [] if numbers else [torch.rand(N, generator=gen, dtype=torch.float64) * 0.3]
    initial = [0.1] if numbers else []
    values = {INPUT_SCALE: torch.rand(C, dtype=torch.float64) + 0.5, INPUT_SHIFT: torch.rand(C, dtype=torch.float64),
              "w": torch.tensor([0.2], dtype=torch.float64)}
    tensors = [values[name] for name in e.tensor_names]
    sizes = dict(zip(CHANNEL_KEYS, (C, INNER)))
    defaults = {p.name: p.default for p in spec.params}
    scalars = [float(sizes[n] if n in sizes else defaults[n]) for n in e.op_scalars]
    outputs = torch.ops.autocuda.neuron_forward(key, x, states, initial, tensors, scalars, False, True, True, [])
    available = {"x_seq": x, **{f"{s}_init": v for s, v in zip(e.state_names, states)},
                 **dict(zip(ops.forward_outputs(key, False, False, True), outputs))}
    saved = [available[n] for n in ops.saved_names(key, False, not numbers)]
    grad = torch.randn(T, N, generator=gen, dtype=torch.float64)
    finals = [torch.ones(N, dtype=torch.float64)]
    for gradients, correction in (("sums", []), ("corrected", [torch.rand(C, dtype=torch.float64)] * 2)):
        torch.library.opcheck(torch.ops.autocuda.neuron_backward_part.default,
                              (key, gradients, grad, finals, saved, initial, tensors, scalars, correction))
    with pytest.raises(ValueError, match="gradients 'sums' or 'corrected'"):
        torch.ops.autocuda.neuron_backward_part(key, "all", grad, finals, saved, initial, tensors, scalars, [])
