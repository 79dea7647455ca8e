"""SpikingJelly 2.0's special neuron classes (noisy, GLIF, levels, online, ILC, MPBN, DSR, few-spike) under
sequences of use, against SpikingJelly's same classes in float64 (parameters copied through the state dict):
several training steps with an optimizer, `reset_net` and `detach_net` between them, attributes set between calls
(thresholds, taus, decays, noise scales, surrogates, level counts, learnable flags), step modes switched where both
are supported, `eval()`/`train()`, another batch size, `inference_mode` then training, `deepcopy` and state-dict
round trips mid-sequence, on the torch reference and the host runner; outputs, states and the gradients of x and
of every learnable parameter after every call (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from backends import CPU_BACKENDS
from conftest import profile

import autocuda.nn as our

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import functional, surrogate
    from spikingjelly.activation_based import neuron as sjn
    from spikingjelly.activation_based.neuron import few_spike as sj_few
    from spikingjelly.activation_based.neuron import noisy as sj_noisy
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)
from test_sj_noisy import share_noise  # noqa: E402  (after the skip: it imports SpikingJelly too)

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}
SLOW = pytest.mark.skipif(profile() != "slow", reason="wider sweep: --slow")
Change = Callable[[torch.nn.Module], Any]


def setting(**values: Any) -> Change:
    def change(layer: torch.nn.Module) -> None:
        for name, value in values.items():
            setattr(layer, name, value)
    return change


def reset(layer: torch.nn.Module) -> None:
    functional.reset_net(layer)


def to_eval(layer: torch.nn.Module) -> None:
    layer.eval()


def to_train(layer: torch.nn.Module) -> None:
    layer.train()


COPY = "deepcopy"  # our layer replaced by its deepcopy (and its optimizer by a new one)
RELOAD = "state_dict"  # our layer replaced by a new one that loads its state dict (the states carried over; the
# settings that are plain attributes are in neither library's state dict: a reload comes before they change)


def first(y: Any) -> torch.Tensor:
    return y[0] if isinstance(y, (list, tuple)) else y


def outputs(y: Any) -> list[torch.Tensor]:
    return list(y) if isinstance(y, (list, tuple)) else [y]


def close(got: Any, expected: Any, what: str, tol: dict[str, float] = TOL) -> None:
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        torch.testing.assert_close(torch.as_tensor(got, dtype=F64), torch.as_tensor(expected, dtype=F64), msg=what,
                                   **tol)
    else:
        assert got == expected, what


def run_twins(theirs: torch.nn.Module, build_mine: Callable[[], torch.nn.Module], steps: list[tuple[tuple, Any]],
              memories: tuple[str, ...], lr: float = 0.3, make_x: Callable[[tuple], torch.Tensor] | None = None,
              param_tol: dict[str, float] = TOL, seed: int = 0) -> torch.nn.Module:
    """Runs `steps` ((input shape, change before the call) each) on both layers, one SGD step after each backward,
    and compares outputs, memories and gradients after each call."""
    mine = build_mine()
    mine.load_state_dict(theirs.state_dict())
    opt_t = torch.optim.SGD(theirs.parameters(), lr=lr) if list(theirs.parameters()) else None
    opt_m = torch.optim.SGD(mine.parameters(), lr=lr) if list(mine.parameters()) else None
    generator = torch.Generator().manual_seed(seed)
    for i, (shape, change) in enumerate(steps):
        if change == COPY:
            mine = copy.deepcopy(mine)
        elif change == RELOAD:
            fresh = build_mine()
            fresh.load_state_dict(mine.state_dict())
            fresh.train(mine.training)
            for name in memories:
                setattr(fresh, name, getattr(mine, name))
            mine = fresh
        elif change is not None:
            change(theirs), change(mine)
        if change in (COPY, RELOAD):
            opt_m = torch.optim.SGD(mine.parameters(), lr=lr) if list(mine.parameters()) else None
        x = make_x(shape) if make_x else 1.5 * torch.randn(*shape, dtype=F64, generator=generator) + 0.3
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        for opt in (opt_t, opt_m):
            if opt is not None:
                opt.zero_grad()
        a, b = outputs(theirs(xa.clone())), outputs(mine(xb))  # a copy: SpikingJelly's ILC nodes write into x
        assert len(a) == len(b), f"call {i}: outputs"
        for k, (p, q) in enumerate(zip(a, b)):
            close(q, p, f"call {i}: output {k}")
        weight = torch.randn(a[0].shape, dtype=F64, generator=generator)
        if a[0].requires_grad:
            (a[0] * weight).sum().backward()
            (b[0] * weight).sum().backward()
            close(xb.grad, xa.grad, f"call {i}: x's gradient")
        for name in memories:
            close(getattr(mine, name), getattr(theirs, name), f"call {i}: memory {name}")
        ours = dict(mine.named_parameters())
        for name, p in theirs.named_parameters():
            q = ours[name]
            assert (p.grad is None) == (q.grad is None), f"call {i}: {name}'s gradient"
            if p.grad is not None:
                close(q.grad, p.grad, f"call {i}: {name}'s gradient", param_tol)
        for opt in (opt_t, opt_m):
            if opt is not None:
                opt.step()
        functional.detach_net(theirs), functional.detach_net(mine)
    return mine


# ---------------------------------------------------------------------------------------------------- the fault

@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_ottt_trace_starts_afresh_on_another_batch_size(backend: str) -> None:
    """A new input shape starts the states afresh without a reset; OTTTLIFNode's trace did not: a batch of 3 after
    one of 2 failed inside torch (a broadcast error), and after a batch of 1 it spread that sample's trace over the
    3 (silently wrong). Now the trace restarts with the membrane, as a fresh layer's (SpikingJelly's fails on both)."""
    x3 = torch.rand(3, 5, dtype=F64) * 3
    fresh = our.OTTTLIFNode(backend=backend)
    expected = fresh(x3)
    for batch in (2, 1):
        layer = our.OTTTLIFNode(backend=backend)
        for _ in range(2):
            layer(torch.rand(batch, 5, dtype=F64) * 3)
        spike, trace = layer(x3)
        assert torch.equal(spike, expected[0]) and torch.equal(trace, expected[1]), batch
        assert torch.equal(layer.trace, fresh.trace) and torch.equal(layer.v, fresh.v)
        # the memory protocol's path (explicit states) restarts it too
        states = layer.materialize_states((torch.rand(4, 5, dtype=F64),), (layer.v, layer.trace), "s")
        assert states[1].shape == (4, 5) and not states[1].any()


# ------------------------------------------------------------------------------------------------- noisy nodes

def noisy_steps(features: int) -> list[tuple[tuple, Any]]:
    return [((4, 3, features), None), ((4, 2, features), setting(v_threshold=0.3)),
            ((4, 5, features), setting(sigma_v=0.9, sigma_s=0.01)), ((4, 3, features), COPY),
            ((4, 3, features), setting(v_reset=-0.2)), ((4, 1, features), setting(is_training=False)),
            ((4, 2, features), to_eval), ((4, 2, features), setting(is_training=True))]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ["NoisyCUBALIFNode", "NoisyILCCUBALIFNode"])
def test_noisy_nodes_over_a_sequence_as_theirs(name: str, backend: str) -> None:
    """The noise follows `is_training` (not `eval()`, as SpikingJelly's), each training call takes the next
    episode; scales, thresholds, resets and decays set between calls; copies carry the episode count."""
    size = (2, 3) if "ILC" in name else (6,)
    torch.manual_seed(1)
    theirs = getattr(sjn, name)(*size, T=4, beta=1.0).to(F64)

    def build() -> torch.nn.Module:
        return getattr(our, name)(*size, T=4, beta=1.0, backend=backend).to(F64)

    mine = build()
    share_noise(theirs, mine, 8, ("eps_v_seq", "eps_s_seq"))
    steps = noisy_steps(6) + [((4, 3, 6), setting(c_decay=0.2, v_decay=0.6))]
    # ours replaced by a copy at once (the episodes carried by copy), then sequence as above
    run_twins(theirs, lambda: copy.deepcopy(mine), steps, ("v", "c"))


def test_noisy_non_spiking_over_a_sequence_as_theirs() -> None:
    theirs = sjn.NoisyNonSpikingIFNode(6, T=4, sigma_init=2.0, decode="max-abs-mem")
    mine = our.NoisyNonSpikingIFNode(6, T=4, sigma_init=2.0, decode="max-abs-mem", backend="reference")
    share_noise(theirs, mine, 6, ("eps_seq",))
    steps = [((4, 3, 6), None), ((4, 2, 6), setting(decode="mean-mem")), ((4, 5, 6), COPY),
             ((4, 2, 6), setting(is_training=False)), ((4, 3, 6), setting(is_training=True, decode="last-me"))]
    # sigma is float32 (as theirs): its gradient sums products in each library's order (see test_sj_noisy)
    run_twins(theirs, lambda: copy.deepcopy(mine), steps, ("v",), lr=0.0, param_tol={"rtol": 1e-5, "atol": 1e-5})


def test_noisy_episodes_follow_torchs_seed_and_theirs_for_one_random_state() -> None:
    """torch.manual_seed repeats a whole sequence of training calls; an explicit numpy generator gives
    SpikingJelly's draws."""
    x = torch.rand(3, 2, 5, dtype=F64)

    def calls() -> list[torch.Tensor]:
        layer = our.NoisyCUBALIFNode(5, T=3, beta=1.0, backend="reference")
        torch.manual_seed(7)
        layer.reset_noise(3)
        return [layer(x) for _ in range(3)]

    first_run, second_run = calls(), calls()
    assert all(torch.equal(a, b) for a, b in zip(first_run, second_run))
    assert not torch.equal(first_run[0], first_run[1])
    mine, theirs = our.NoisyCUBALIFNode(5, T=3, beta=1.0), sjn.NoisyCUBALIFNode(5, T=3, beta=1.0)
    mine.reset_noise(2, random_state=np.random.default_rng(11))
    draw, seeded = sj_noisy.powerlaw_psd_gaussian, np.random.default_rng(11)
    sj_noisy.powerlaw_psd_gaussian = lambda exponent, size: draw(exponent, size, random_state=seeded)
    try:
        theirs.reset_noise(2)
    finally:
        sj_noisy.powerlaw_psd_gaussian = draw
    assert torch.equal(mine.eps_v_seq, theirs.eps_v_seq) and torch.equal(mine.eps_s_seq, theirs.eps_s_seq)


# -------------------------------------------------------------------------------------------------------- GLIF

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("inplane", [None, 3])
def test_gated_lif_trains_over_a_sequence_as_theirs(inplane: int | None, backend: str) -> None:
    """The membrane kept between calls (reset_net, detach_net between), every parameter stepped by SGD (read at the
    next call), a copy and a reload mid-sequence, a parameter frozen."""
    np.random.seed(0)
    theirs = sjn.GatedLIFNode(4, inplane=inplane).to(F64)

    def build() -> torch.nn.Module:
        return our.GatedLIFNode(4, inplane=inplane, backend=backend).to(F64)

    steps = [((4, 2, 3, 2, 2), None), ((4, 2, 3, 2, 2), None), ((4, 3, 3, 2, 2), reset), ((4, 3, 3, 2, 2), COPY),
             ((4, 3, 3, 2, 2), RELOAD), ((4, 3, 3, 2, 2), lambda n: n.alpha.requires_grad_(False)),
             ((4, 1, 3, 2, 2), reset)]
    run_twins(theirs, build, steps, ("v",), lr=0.5)


# ------------------------------------------------------------------------------------------------------ levels

LEVEL_STEPS = [((2, 5), None), ((2, 5), setting(v_threshold=0.7)), ((3, 2, 5), setting(step_mode="m")),
               ((3, 3, 5), setting(detach_reset=True)), ((3, 3, 5), reset), ((2, 5), setting(step_mode="s")),
               ((2, 5), COPY), ((4, 5), to_eval)]
TERNARY_STEPS = [*LEVEL_STEPS[:3], ((3, 3, 5), setting(v_reset=None)), *LEVEL_STEPS[3:],
                 ((2, 5), setting(v_reset=0.2))]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("name", "extra"), [
    ("TernaryIFNode", []),
    ("TernaryLIFNode", [((2, 5), setting(tau=3.0)), ((2, 5), setting(decay_input=False))]),
    ("ILIFNode", [((2, 5), setting(tau=3.0))]),
])
def test_level_nodes_over_a_sequence_as_theirs(name: str, extra: list, backend: str) -> None:
    if name == "ILIFNode":
        count = surrogate.MultiLevelSpikeCount(4)
        theirs = sjn.ILIFNode(surrogate_function=count)
        steps = [*LEVEL_STEPS, *extra, ((2, 5), lambda n: setattr(count, "max_spike_count", 2)),
                 ((2, 5), setting(surrogate_function=surrogate.MultiLevelSpikeCount(6)))]
        kwargs: dict[str, Any] = {"surrogate_function": count}
    else:
        kwargs = {"surrogate_function": surrogate.Sigmoid(alpha=3.0)}
        theirs = getattr(sjn, name)(**kwargs)
        steps = [*TERNARY_STEPS, *extra,
                 ((2, 5), lambda n: setattr(n, "surrogate_function", surrogate.ATan(alpha=1.5)))]
    run_twins(theirs, lambda: getattr(our, name)(backend=backend, **kwargs), steps, ("v",),
              make_x=lambda shape: 3.0 * torch.rand(*shape, dtype=F64) - 1.5)


# ------------------------------------------------------------------------------------------------------ online

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ["OTTTLIFNode", "SLTTLIFNode"])
def test_online_nodes_over_a_sequence_as_theirs(name: str, backend: str) -> None:
    """Training steps (each from the detached membrane), eval steps (no gradient through the spike) and back, the
    trace kept across; tau (the trace's decay too), thresholds, resets and switches set between calls."""
    sg = surrogate.Sigmoid()
    theirs = getattr(sjn, name)(surrogate_function=sg)
    memories = ("v", "trace") if name == "OTTTLIFNode" else ("v",)
    steps = [((2, 5), None), ((2, 5), RELOAD), ((2, 5), setting(tau=3.0)), ((2, 5), to_eval), ((2, 5), None),
             ((2, 5), to_train), ((3, 5), reset), ((3, 5), setting(v_threshold=0.5)), ((3, 5), COPY),
             ((3, 5), setting(v_reset=0.1)), ((3, 5), setting(detach_reset=False)),
             ((3, 5), setting(decay_input=not theirs.decay_input))]
    run_twins(theirs, lambda: getattr(our, name)(surrogate_function=sg, backend=backend), steps, memories)


# --------------------------------------------------------------------------------------------------------- ILC

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", [pytest.param("ILCIFNode", marks=SLOW), pytest.param("ILCLIFNode", marks=SLOW),
                                  "ILCCUBALIFNode"])
def test_ilc_nodes_train_over_a_sequence_as_theirs(name: str, backend: str) -> None:
    torch.manual_seed(3)
    theirs = getattr(sjn, name)(2, 3).to(F64)
    steps = [((4, 3, 6), None), ((4, 3, 6), RELOAD), ((4, 2, 6), setting(v_threshold=0.6)), ((4, 2, 6), COPY),
             ((4, 2, 6), setting(v_reset=-0.1)), ((4, 4, 6), setting(surrogate_function=surrogate.ATan())),
             ((4, 1, 6), to_eval)]
    if name != "ILCIFNode":
        steps.append(((4, 2, 6), setting(v_decay=0.5)))
    if name == "ILCCUBALIFNode":
        steps.append(((4, 2, 6), setting(c_decay=0.2)))
    run_twins(theirs, lambda: getattr(our, name)(2, 3, backend=backend).to(F64), steps, ("v",))


# -------------------------------------------------------------------------------------------------------- MPBN

def mpbn_backend(backend: str) -> str:
    return "torch" if backend == "reference" else backend


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("conv", [False, pytest.param(True, marks=SLOW)])
def test_mpbn_trains_over_a_sequence_as_theirs(conv: bool, backend: str) -> None:
    """The running statistics (compared through the state dict after every call), eval and back, step modes, a
    copy, tau, decay_input, v_reset, detach_reset and the BatchNorm's momentum set between calls."""
    features = {"out_channels": 4} if conv else {"out_features": 4}
    tail = (4, 2, 2) if conv else (4,)
    sg = surrogate.Sigmoid()
    theirs = sjn.MPBNLIFNode(surrogate_function=sg, **features).to(F64)

    def build() -> torch.nn.Module:
        layer = our.MPBNLIFNode(surrogate_function=sg, **features).to(F64)
        layer.backend = mpbn_backend(backend)
        return layer

    def stats_equal(layer: torch.nn.Module) -> None:
        if isinstance(layer, our.MPBNLIFNode):
            for (name, p), q in zip(layer.state_dict().items(), theirs.state_dict().values()):
                close(p, q, name)

    steps = [((4, *tail), None), ((4, *tail), None), ((3, 4, *tail), setting(step_mode="m")),
             ((3, 4, *tail), to_eval), ((3, 4, *tail), to_train), ((3, 4, *tail), COPY),
             ((3, 5, *tail), setting(v_threshold=0.5)), ((3, 5, *tail), setting(tau=3.0)),
             ((3, 5, *tail), setting(decay_input=True)), ((3, 5, *tail), setting(v_reset=None)),
             ((3, 5, *tail), setting(detach_reset=True)), ((3, 3, *tail), lambda n: setattr(n.vbn, "momentum", 0.3)),
             ((3, 3, *tail), stats_equal), ((4, *tail), setting(step_mode="s"))]
    mine = run_twins(theirs, build, steps, ("v",))
    stats_equal(mine)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("learnable_vth", [False, True])
def test_mpbn_folded_for_test_time_adaptation_as_theirs(learnable_vth: bool, backend: str) -> None:
    """After `re_parameterize_v_threshold(normalize_residual=True, running_stats=True)`, training calls re-estimate
    mu and sigma2 with a decaying momentum, eval calls keep them; a reload of the folded state dict in between."""
    sg = surrogate.Sigmoid()
    theirs = sjn.MPBNLIFNode(surrogate_function=sg, out_features=4, learnable_vth=learnable_vth).to(F64)

    def build() -> torch.nn.Module:
        layer = our.MPBNLIFNode(surrogate_function=sg, out_features=4, learnable_vth=learnable_vth).to(F64)
        layer.backend = mpbn_backend(backend)
        return layer

    def fold(layer: torch.nn.Module) -> None:
        layer.re_parameterize_v_threshold(True, True)

    def folded_statistics_equal(layer: torch.nn.Module) -> None:
        if isinstance(layer, our.MPBNLIFNode):
            for name in ("mu", "sigma2", "bn_momentum", "v_threshold"):
                close(getattr(layer, name), getattr(theirs, name), name)

    steps = [((4, 4), None), ((4, 4), fold), ((4, 4), folded_statistics_equal), ((3, 4, 4), setting(step_mode="m")),
             ((3, 4, 4), COPY), ((3, 4, 4), folded_statistics_equal), ((3, 5, 4), to_eval),
             ((3, 5, 4), folded_statistics_equal), ((3, 5, 4), to_train), ((3, 3, 4), setting(running_stats=False)),
             ((3, 3, 4), folded_statistics_equal)]
    run_twins(theirs, build, steps, ("v",))


# --------------------------------------------------------------------------------------------------------- DSR

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ["DSRIFNode", "DSRLIFNode"])
def test_dsr_nodes_train_over_a_sequence_as_theirs(name: str, backend: str) -> None:
    """float32 (SpikingJelly's outputs are float32 whatever the input): the threshold learned, alpha, the gradient
    scale, the lower bound, tau and delta_t set between calls, the threshold frozen."""
    kwargs: dict[str, Any] = {"v_threshold": 1.0} if name == "DSRIFNode" else {}
    theirs = getattr(sjn, name)(T=4, **kwargs)
    steps = [((4, 3, 6), None), ((4, 2, 6), setting(alpha=0.8)), ((4, 2, 6), COPY),
             ((4, 2, 6), setting(v_threshold_grad_scaling=0.3)), ((4, 4, 6), setting(v_threshold_lower_bound=0.5)),
             ((4, 3, 6), lambda n: n.v_threshold.requires_grad_(False)), ((4, 2, 6), to_eval)]
    if name == "DSRLIFNode":
        steps += [((4, 2, 6), setting(tau=3.0)), ((4, 2, 6), setting(delta_t=0.1))]
    run_twins(theirs, lambda: getattr(our, name)(T=4, backend=backend, **kwargs), steps, (),
              make_x=lambda shape: 2.5 * torch.rand(*shape) - 0.5, param_tol={"rtol": 1e-6, "atol": 1e-6})


# ---------------------------------------------------------------------------------------------------- few-spike

def few_spike_columns(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    theta = torch.sort(torch.rand(4, generator=g, dtype=F64), descending=True).values
    return theta, theta * (0.8 + 0.4 * torch.rand(4, generator=g, dtype=F64)), torch.rand(4, generator=g, dtype=F64)


@pytest.mark.parametrize("name", ["FewSpikeNode", "OutlierAwareThresholdNode", "HGNode"])
def test_few_spike_nodes_over_a_sequence_as_theirs(name: str) -> None:
    """Step modes switched, a table changed in place, the surrogate's alpha and the split settings changed."""
    sg = surrogate.Sigmoid(alpha=3.0)

    def build(module: Any) -> torch.nn.Module:
        tables = [module.FewSpikeTable(*few_spike_columns(seed)) for seed in (1, 2, 3)]
        if name == "FewSpikeNode":
            return module.FewSpikeNode(tables[0], sg, "s")
        if name == "OutlierAwareThresholdNode":
            return module.OutlierAwareThresholdNode(tables[0], tables[1], 0.6, 1.5, sg, "s")
        return module.HGNode(tables, [-0.2, 0.5], sg, "s")

    table = "region_theta" if name == "HGNode" else "theta"
    steps = [((3, 5), None), ((4, 3, 5), setting(step_mode="m")),
             ((4, 2, 5), lambda n: getattr(n, table).mul_(0.7)), ((4, 2, 5), COPY),
             ((4, 2, 5), lambda n: setattr(n.surrogate_function, "alpha", 1.5)), ((2, 5), setting(step_mode="s"))]
    if name == "OutlierAwareThresholdNode":
        steps += [((2, 5), setting(split_threshold=0.3)), ((2, 5), setting(clamp_value=0.9))]
    run_twins(build(sj_few), lambda: build(our), steps, (), make_x=lambda shape: 1.2 * torch.randn(*shape, dtype=F64))


# ------------------------------------------------------------------------------------ inference mode, then training

def _mpbn(backend: str) -> torch.nn.Module:
    layer = our.MPBNLIFNode(out_features=6, step_mode="m")
    layer.backend = mpbn_backend(backend)
    return layer


BUILDERS: dict[str, tuple[Callable[[str], torch.nn.Module], tuple[int, ...]]] = {
    "NoisyCUBALIFNode": (lambda b: our.NoisyCUBALIFNode(6, T=3, backend=b), (3, 2, 6)),
    "NoisyILCCUBALIFNode": (lambda b: our.NoisyILCCUBALIFNode(2, 3, T=3, backend=b), (3, 2, 6)),
    "NoisyNonSpikingIFNode": (lambda b: our.NoisyNonSpikingIFNode(6, T=3, decode="mean-mem", backend=b), (3, 2, 6)),
    "GatedLIFNode": (lambda b: our.GatedLIFNode(3, backend=b), (3, 2, 6)),
    "TernaryLIFNode": (lambda b: our.TernaryLIFNode(step_mode="m", backend=b), (3, 2, 6)),
    "ILIFNode": (lambda b: our.ILIFNode(backend=b), (2, 6)),
    "OTTTLIFNode": (lambda b: our.OTTTLIFNode(backend=b), (2, 6)),
    "SLTTLIFNode": (lambda b: our.SLTTLIFNode(backend=b), (2, 6)),
    "ILCCUBALIFNode": (lambda b: our.ILCCUBALIFNode(2, 3, backend=b), (3, 2, 6)),
    "MPBNLIFNode": (_mpbn, (3, 2, 6)),
    "DSRLIFNode": (lambda b: our.DSRLIFNode(T=3, backend=b), (3, 2, 6)),
    "LIAFNode": (lambda b: our.LIAFNode(torch.nn.ReLU(), False, backend=b), (2, 6)),
    "ComplementaryLIFNode": (lambda b: our.ComplementaryLIFNode(backend=b), (2, 6)),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_call_under_inference_mode_then_training(name: str, backend: str) -> None:
    """States (and MPBN's statistics) left by a call under `torch.inference_mode` do not break a training call
    after it, which equals a twin's whose first call ran under `no_grad`."""
    build, shape = BUILDERS[name]
    x = 2 * torch.rand(*shape, dtype=F64)
    results = []
    for context in (torch.inference_mode, torch.no_grad):
        np.random.seed(1), torch.manual_seed(1)
        layer = build(backend).to(F64)
        if hasattr(layer, "reset_noise"):
            layer.reset_noise(3)
        with context():
            layer(x)
        y = x.clone().requires_grad_(True)
        out = first(layer(y))
        out.sum().backward()
        results.append((out.detach(), y.grad))
    (a, ga), (b, gb) = results
    assert torch.equal(a, b) and torch.equal(ga, gb)


# ------------------------------------------------------------------------------------------------- wider sweeps

@SLOW
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_noisy_cuba_lif_random_sequences_as_theirs(seed: int, backend: str) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    theirs = sjn.NoisyCUBALIFNode(6, T=4, beta=float(rng.uniform(0, 2))).to(F64)
    mine = our.NoisyCUBALIFNode(6, T=4, beta=theirs.beta, backend=backend).to(F64)
    share_noise(theirs, mine, 12, ("eps_v_seq", "eps_s_seq"))
    changes: list[Any] = [None, setting(v_threshold=float(rng.uniform(0.2, 1))), setting(sigma_v=0.3, sigma_s=0.2),
                          COPY, setting(v_decay=float(rng.uniform(0.1, 0.9))), setting(is_training=False),
                          setting(is_training=True), setting(v_reset=float(rng.uniform(-0.5, 0)))]
    steps = [((4, int(rng.integers(1, 5)), 6), changes[int(rng.integers(len(changes)))]) for _ in range(10)]
    run_twins(theirs, lambda: copy.deepcopy(mine), steps, ("v", "c"))
