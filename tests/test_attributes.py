"""What a user can get wrong with SpikingJelly's classes, refused by name or taking effect: every constructor argument
of a number or a flag that a built layer holds as an attribute, set on the built layer, takes effect or is refused
(after a reset, the layer's call equals that of a layer built with the new value, learnable parameters initialised
alike, or the assignment raises); sizes fixed at construction; arguments of the wrong kind; switches and backends
set later; empty sequences. Arguments that only initialise a parameter (`init_tau`, `exp_init`) are no attributes
of the layer, as in SpikingJelly, and are not asked about."""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

from autocuda import nn as ann

T = 4


def _tables(*scales: float) -> list[Any]:
    halves = 2.0 ** -torch.arange(T, dtype=torch.float32)
    return [ann.FewSpikeTable(s * halves, s * halves, s * halves) for s in scales]


FLAT, IMAGES, POPULATIONS = (T, 16), (T, 2, 3, 4, 4), (T, 3, 8)
# class name -> (the arguments it is built with, besides the one changed; its input's shape)
CASES: dict[str, tuple[Callable[[], dict[str, Any]], tuple[int, ...]]] = {
    **{name: (dict, FLAT) for name in (
        "IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode", "ALIFNode",
        "KLIFNode", "RAFNode", "SimpleIFNode", "HalfThresholdIFNode", "NonSpikingIFNode", "NonSpikingLIFNode",
        "ComplementaryLIFNode", "ILIFNode", "TernaryIFNode", "TernaryLIFNode",
        "CUBALIFNode")},
    "OTTTLIFNode": (dict, FLAT[1:]),  # single steps only
    "SLTTLIFNode": (dict, FLAT[1:]),
    "SimpleLIFNode": (lambda: {"tau": 2.0, "decay_input": True}, FLAT),
    "LIAFNode": (lambda: {"act": torch.nn.ReLU(), "threshold_related": True}, FLAT),
    "DSRIFNode": (lambda: {"T": T}, FLAT),
    "DSRLIFNode": (lambda: {"T": T}, FLAT),
    "STBIFNode": (lambda: {"q_threshold": 0.5, "level": 8, "sym": True}, FLAT),
    "ActivationAwareIFNode": (lambda: {"v_threshold": 0.75, "v_offset": 0.25}, FLAT),
    "MPBNLIFNode": (lambda: {"out_channels": 3}, IMAGES),
    "GatedLIFNode": (lambda: {"T": T, "inplane": 3}, IMAGES),
    "PSN": (lambda: {"T": T}, FLAT),
    "MaskedPSN": (lambda: {"k": 2, "T": T}, FLAT),
    "SlidingPSN": (lambda: {"k": 2}, FLAT),
    "ILCIFNode": (lambda: {"act_dim": 2, "dec_pop_dim": 4}, POPULATIONS),
    "ILCLIFNode": (lambda: {"act_dim": 2, "dec_pop_dim": 4}, POPULATIONS),
    "ILCCUBALIFNode": (lambda: {"act_dim": 2, "dec_pop_dim": 4}, POPULATIONS),
    "NoisyCUBALIFNode": (lambda: {"num_node": 8, "T": T}, POPULATIONS),
    "NoisyNonSpikingIFNode": (lambda: {"num_node": 8, "T": T}, POPULATIONS),
    "NoisyILCCUBALIFNode": (lambda: {"act_dim": 2, "dec_pop_dim": 4, "T": T}, POPULATIONS),
    "FewSpikeNode": (lambda: {"table": _tables(4.0)[0]}, FLAT),
    "HGNode": (lambda: {"tables": _tables(1.0, 4.0), "gate_thresholds": [2.0]}, FLAT),
    "OutlierAwareThresholdNode": (lambda: {"table": _tables(4.0)[0], "outlier_table": _tables(16.0)[0],
                                           "split_threshold": 4.0, "clamp_value": 16.0}, FLAT),
}
UNASKED = ("self", "step_mode", "backend", "store_v_seq",  # tested elsewhere (test_nn, test_layer_calls)
           "T")  # the input's length: `test_a_changed_size_takes_effect_or_is_refused`


def _changed(default: Any) -> Any:
    """Another value of a default's kind (None: not a number or a flag)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 1.5 + 0.1 if default else 0.1
    return None


def _build(cls: type, kwargs: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)  # learnable parameters initialised alike
    steps = {"step_mode": "m"} if "step_mode" in inspect.signature(cls).parameters and cls.__name__ not in (
        "OTTTLIFNode", "SLTTLIFNode") else {}
    return cls(**kwargs, **steps)


def _call(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's output on x from its initial states (and the same noise episode)."""
    if hasattr(layer, "reset"):
        layer.reset()
    if hasattr(layer, "reset_noise"):
        layer.reset_noise(1, random_state=0)
    with torch.no_grad():
        out = layer(x)
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_changed_argument_takes_effect_or_is_refused(name: str) -> None:
    cls = getattr(ann, name, None) or getattr(ann.spikingjelly_more, name)
    make, shape = CASES[name]
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(1)) * 2
    asked = 0
    for param in inspect.signature(cls).parameters.values():
        value = None if param.name in UNASKED else _changed(make().get(param.name, param.default))
        if value is None or not hasattr(_build(cls, make()), param.name):
            continue
        changed = _build(cls, make())
        try:
            setattr(changed, param.name, value)
        except (TypeError, ValueError, AttributeError):
            continue  # refused
        asked += 1
        want = _call(_build(cls, {**make(), param.name: value}), x)
        assert torch.equal(_call(changed, x), want), f"{name}.{param.name} = {value!r} set after building"
    assert asked or name in NOTHING_TO_ASK, f"{name}: no argument asked about"


# Classes whose numbers and flags are all refused once built or only initialise parameters
NOTHING_TO_ASK = ("DSRIFNode", "DSRLIFNode", "FewSpikeNode", "GatedLIFNode", "HGNode", "MaskedPSN", "NonSpikingIFNode",
                  "PSN", "SlidingPSN", "STBIFNode")


# Sizes of a built layer and the input shape of a given size: each set anew is refused, or the layer's call on an
# input of the new size equals that of a layer built with it
SIZES = [("DSRIFNode", "T", lambda t: (t, 16)), ("DSRLIFNode", "T", lambda t: (t, 16)),
         ("GatedLIFNode", "T", lambda t: (t, 2, 3, 4, 4)), ("PSN", "T", lambda t: (t, 16)),
         ("MaskedPSN", "T", lambda t: (t, 16)), ("MaskedPSN", "k", lambda k: (T, 16)),
         ("SlidingPSN", "k", lambda k: (T, 16)),
         ("NoisyCUBALIFNode", "T", lambda t: (t, 3, 8)), ("NoisyCUBALIFNode", "num_node", lambda n: (T, 3, n)),
         ("NoisyNonSpikingIFNode", "T", lambda t: (t, 3, 8)),
         ("NoisyNonSpikingIFNode", "num_node", lambda n: (T, 3, n)),
         ("NoisyILCCUBALIFNode", "T", lambda t: (t, 3, 8)),
         *((name, size, lambda n, size=size: (T, 3, n * 4 if size == "act_dim" else 2 * n))
           for name in ("ILCIFNode", "ILCLIFNode", "ILCCUBALIFNode", "NoisyILCCUBALIFNode")
           for size in ("act_dim", "dec_pop_dim")),
         ("STBIFNode", "level", lambda level: (T, 16)), ("STBIFNode", "sym", lambda sym: (T, 16))]


@pytest.mark.parametrize("name, size, shape", SIZES, ids=[f"{n}.{s}" for n, s, _ in SIZES])
def test_a_changed_size_takes_effect_or_is_refused(name: str, size: str, shape: Callable[[Any], tuple[int, ...]]
                                                  ) -> None:
    cls = getattr(ann, name)
    make, _ = CASES[name]
    layer = _build(cls, make())
    value = _changed(getattr(layer, size))
    try:
        setattr(layer, size, value)
    except AttributeError as error:
        assert size in str(error) and "construction" in str(error)
        return
    x = torch.rand(*shape(value), generator=torch.Generator().manual_seed(1)) * 2
    assert torch.equal(_call(layer, x), _call(_build(cls, {**make(), size: value}), x)), f"{name}.{size}"


def test_settings_that_a_method_makes_are_refused_where_they_would_not_hold() -> None:
    """MPBNLIFNode's fold_bn is set by `re_parameterize_v_threshold` alone; its normalize_residual and
    running_stats apply to a folded layer (before, they are refused, not ignored; after, one set takes effect);
    the ILC nodes' out_pop_dim is a size (set anew, the layer asked for inputs it could not take)."""
    layer = _build(ann.MPBNLIFNode, {"out_channels": 3})
    for name in ("fold_bn", "normalize_residual", "running_stats"):
        with pytest.raises(AttributeError, match=f"{name}.*re_parameterize_v_threshold"):
            setattr(layer, name, True)
    x = torch.randn(*IMAGES, generator=torch.Generator().manual_seed(2))

    def folded(normalize_residual: bool = False) -> torch.nn.Module:
        made = _build(ann.MPBNLIFNode, {"out_channels": 3})
        with torch.no_grad():  # a BatchNorm that is no identity, so that the residual's normalisation shows
            made.vbn.running_mean.fill_(0.3), made.vbn.running_var.fill_(2.0)
            made.vbn.weight.fill_(1.5), made.vbn.bias.fill_(0.1)
        made.eval()
        made.re_parameterize_v_threshold(normalize_residual=normalize_residual)
        return made

    layer = folded()
    with pytest.raises(AttributeError, match="fold_bn.*build a new layer"):
        layer.fold_bn = False
    plain = _call(layer, x)
    layer.normalize_residual = True
    assert torch.equal(_call(layer, x), _call(folded(normalize_residual=True), x))
    assert not torch.equal(_call(layer, x), plain)
    with pytest.raises(AttributeError, match="out_pop_dim.*construction"):
        _build(ann.ILCIFNode, {"act_dim": 2, "dec_pop_dim": 4}).out_pop_dim = 12


# (class, the argument, a value of the wrong kind): each refused at construction by an error naming the argument
BAD_ARGUMENTS = [
    ("LIFNode", "backend", [1, 2]), ("DSRIFNode", "backend", [1, 2]), ("NonSpikingIFNode", "decode", [1, 2]),
    ("NoisyNonSpikingIFNode", "decode", [1, 2]), ("IzhikevichNode", "w_rest", "0.1"), ("AdExNode", "w_rest", [0.1]),
    ("ActivationAwareIFNode", "v_threshold", None), ("ActivationAwareIFNode", "v_offset", "bad"),
    ("HGNode", "gate_thresholds", None), ("HGNode", "gate_thresholds", "bad"), ("MaskedPSN", "lambda_init", None),
    ("NoisyCUBALIFNode", "sigma_init", None), ("NoisyCUBALIFNode", "beta", "bad"),
    ("NoisyNonSpikingIFNode", "sigma_init", "bad"), ("OutlierAwareThresholdNode", "split_threshold", None),
    ("OutlierAwareThresholdNode", "clamp_value", "bad"), ("STBIFNode", "level", float("nan")),
    ("MPBNLIFNode", "bn_momentum", "bad"), ("MPBNLIFNode", "bn_min_momentum", None),
    # a NaN noise scale made every output NaN
    ("NoisyCUBALIFNode", "sigma_init", float("nan")), ("NoisyCUBALIFNode", "beta", float("inf")),
]


@pytest.mark.parametrize("name, argument, value", BAD_ARGUMENTS, ids=[f"{n}.{a}" for n, a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_by_name(name: str, argument: str, value: Any) -> None:
    cls = getattr(ann, name)
    make, _ = CASES[name]
    with pytest.raises((TypeError, ValueError), match=argument):
        _build(cls, {**make(), argument: value})


@pytest.mark.parametrize("name", ["LIFNode", "DSRIFNode", "MPBNLIFNode", "STBIFNode"])
def test_a_bad_backend_set_after_building_is_refused(name: str) -> None:
    """As at construction (a call would have failed on it with a KeyError, or not at all until then)."""
    layer = _build(getattr(ann, name), CASES[name][0]())
    for bad in ("bad", [1, 2]):
        with pytest.raises(ValueError, match="backend"):
            layer.backend = bad
    layer.backend = "torch"
    assert layer.backend == "torch"


def test_a_layer_switch_set_after_building_is_checked_as_at_construction() -> None:
    layer = ann.LIFNode(step_mode="m")
    for name in ("detach_reset", "store_v_seq", "recompute", "save_h", "store_final_states"):
        with pytest.raises(TypeError, match=f"{name}: expected True or False"):
            setattr(layer, name, "yes")
        setattr(layer, name, True)
        assert getattr(layer, name) is True


def test_a_parameter_of_a_type_no_call_takes_is_refused_when_set() -> None:
    """A string, a list, a bool or (but for v_reset) None set as a parameter is refused at once, naming it, as at
    construction; before, it was kept and reset() raised a ValueError that named nothing. A number outside the
    domain is refused by the next call (ILIFNode builds with any threshold, as SpikingJelly's)."""
    for value in ("x", [2.0], True, None):
        with pytest.raises(TypeError, match="^tau: expected a number or a tensor"):
            ann.LIFNode(tau=value)
        layer = ann.LIFNode(backend="host")
        with pytest.raises(TypeError, match="^tau: expected a number or a tensor"):
            layer.tau = value
        with pytest.raises(TypeError, match="^v_reset: expected a number or a tensor") if value is not None else \
                _no_error():
            layer.v_reset = value
        layer.reset()
        assert layer.tau == 2.0 and layer(torch.ones(3)).shape == (3,)
    layer = ann.LIFNode(backend="host")
    layer.tau, layer.v_threshold = 3, torch.tensor(0.5)  # h = 1.2 / 3 = 0.4: below 0.5 (at tau 2, 0.6 fires)
    assert torch.equal(layer(torch.full((3,), 1.2)), torch.zeros(3))
    torch.testing.assert_close(layer.v, torch.full((3,), 0.4))
    layer.tau = -1.0
    with pytest.raises(ValueError, match="parameter 'tau' of 'lif' must be > 0"):
        layer(torch.ones(3))


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


EMPTY_REFUSED = ["DSRIFNode", "DSRLIFNode", "ILCIFNode", "ILCLIFNode", "ILCCUBALIFNode",
                 "MPBNLIFNode", "NonSpikingIFNode", "NonSpikingLIFNode"]


@pytest.mark.parametrize("name", EMPTY_REFUSED)
def test_an_empty_sequence_is_refused_by_name_where_a_layer_cannot_run_one(name: str) -> None:
    """T = 0 (or a 0-d tensor) where the layer's call looks for a first step: a ValueError naming the layer and the
    shape (it failed inside with an IndexError or torch.stack's error)."""
    make, shape = CASES[name]
    with pytest.raises(ValueError, match=f"{name}: x_seq: expected a sequence of at least one step"):
        _call(_build(getattr(ann, name), make()), torch.rand(0, *shape[1:]))
    with pytest.raises(ValueError, match=f"{name}: x_seq: expected"):
        _call(_build(getattr(ann, name), make()), torch.tensor(1.0))


def test_an_empty_sequence_runs_where_the_layer_can() -> None:
    """ActivationAwareIFNode (a neuron whose threshold may be per channel): T = 0 gives an empty output and keeps
    the states, as LIFNode does."""
    layer = _build(ann.ActivationAwareIFNode, {"v_threshold": 0.75, "v_offset": 0.25})
    out = _call(layer, torch.rand(0, 16))
    assert out.shape == (0, 16) and bool((torch.as_tensor(layer.v) == 0).all())


def _lif_core(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = v + (x - v) / 2.0
    spike = (h >= 1.0).to(h.dtype)
    return spike, h * (1 - spike)


def test_a_flexsn_core_and_its_state_count_are_fixed_and_its_backend_checked() -> None:
    """The core is traced at construction (its kernels would keep running the old one, its eager backend the new):
    `core` and `num_states` are refused when set; `backend` is checked when set (a bad one failed at the next call)."""
    layer = ann.FlexSN(core=_lif_core, num_states=1)
    with pytest.raises(AttributeError, match="core is fixed at construction"):
        layer.core = lambda x, v: (x, v)
    with pytest.raises(AttributeError, match="num_states is fixed at construction"):
        layer.num_states = 2
    with pytest.raises(ValueError, match="backend"):
        layer.backend = "bad"
    x = torch.rand(4, 8, generator=torch.Generator().manual_seed(3)) * 3
    want = layer(x)
    layer.reset()
    layer.backend = "eager"  # the core itself, step by step: the same spikes
    assert torch.equal(layer(x), want)
    for bad in ("no", 1):  # a word such as "no" is true: it turned the sequences on
        with pytest.raises(TypeError, match="^store_state_seqs: expected True or False"):
            ann.FlexSN(core=_lif_core, num_states=1, store_state_seqs=bad)
        with pytest.raises(TypeError, match="^store_state_seqs: expected True or False"):
            layer.store_state_seqs = bad
    assert layer.store_state_seqs is False
    clif = ann.ComplementaryLIFNode()
    with pytest.raises(TypeError, match="^store_state_seqs: expected True or False"):
        clif.store_state_seqs = "no"


def test_inputs_of_a_kind_a_layer_cannot_take_are_refused_by_name() -> None:
    """MPBN's BatchNorm failed inside torch on bool or complex input. A PSN's half input with float weights failed
    in torch's matmul on CPU where the mixing kernels (CUDA) run it, converting the weights: the composition converts
    them too, so the two agree."""
    make, shape = CASES["MPBNLIFNode"]
    for dtype in (torch.bool, torch.complex64):
        with pytest.raises(TypeError, match=f"^MPBNLIFNode: x: expected a tensor of real numbers, got {dtype}"):
            _call(_build(ann.MPBNLIFNode, make()), torch.ones(shape, dtype=dtype))
    for column in ("x", None):  # failed inside torch.as_tensor
        with pytest.raises(TypeError, match="^theta: expected a number, a sequence of numbers or a tensor"):
            ann.FewSpikeTable(column, [1.0], [1.0])
    layer, x = ann.PSN(4), torch.rand(4, 3)
    half = layer(x.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, copy.deepcopy(layer).half()(x.half()))


def test_a_spec_set_on_a_built_layer_runs_at_the_next_call_or_is_refused() -> None:
    """`layer.spec = ...` was taken and ignored (the calls kept the old spec's kernels): a spec of the same inputs,
    states and parameters runs from the next call on; another is refused by name."""
    from autocuda import load_spec

    x = torch.rand(T, 5, dtype=torch.float64) * 3
    changed = ann.Neuron("lif", step_mode="m", backend="reference")
    changed.spec = load_spec("lif").with_options(decay_input=False)
    built = ann.Neuron(load_spec("lif").with_options(decay_input=False), step_mode="m", backend="reference")
    assert torch.equal(changed(x), built(x)) and torch.equal(changed.v, built.v)
    assert not torch.equal(ann.Neuron("lif", step_mode="m", backend="reference")(x), built(x))  # (they differ)
    with pytest.raises(ValueError, match="^spec: a layer's states are fixed at construction"):
        changed.spec = load_spec("izhikevich")


def test_a_membrane_starting_at_v_reset_starts_at_0_under_a_spec_whose_reset_is_soft() -> None:
    """A state whose initial value is "v_reset" starts at 0 where the reset is not hard (docs/semantics.md), in a
    layer as in the functional calls: the layer started it at v_reset's value."""
    from autocuda import spec_from_toml
    from autocuda.call import functional as F

    spec = spec_from_toml('name = "soft_start"\nreset = "soft"\ncharge = "v + x"\nthreshold = "v_threshold"\n'
                          '[params]\nv_threshold = 1.0\nv_reset = 0.5\n[states]\nv = "v_reset"\n')
    layer = ann.Neuron(spec, step_mode="m", backend="reference")
    assert layer.v == 0.0 and layer.get_reset_value("v") == 0.0
    x = torch.zeros(1, 2)
    assert torch.equal(layer(x), F.multi_step(spec, x, backend="reference")[0])
    assert torch.equal(layer.v, F.multi_step(spec, x, backend="reference")[1][0])
