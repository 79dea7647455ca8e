"""The few-spike kernels (`autocuda.call.few_spike`, `codegen.few_spike_kernel`), run on the CPU through the host
runner, against the layers' torch composition (SpikingJelly's steps): FewSpikeNode, HGNode and
OutlierAwareThresholdNode (with and without its clamp) in both step modes, the same outputs and input gradients;
calls the kernels cannot run are composed."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched, profile

from autocuda.call import few_spike
from autocuda.nn import FewSpikeNode, FewSpikeTable, HGNode, OutlierAwareThresholdNode
from autocuda.spec.surrogate import ATan, Sigmoid

F64 = torch.float64
TOLERANCE = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def table(scale: float, steps: int = 4) -> FewSpikeTable:
    halves = torch.tensor([0.5 ** (k + 1) for k in range(steps)], dtype=F64) * scale
    return FewSpikeTable(halves, halves, halves)


def layers(step_mode: str) -> dict[str, torch.nn.Module]:
    return {"FewSpikeNode": FewSpikeNode(table(4.0), step_mode=step_mode),
            "HGNode": HGNode([table(1.0), table(4.0), table(16.0)], [0.0, 4.0], surrogate_function=ATan(),
                             step_mode=step_mode),
            "OutlierAwareThresholdNode": OutlierAwareThresholdNode(table(4.0), table(16.0), 3.0, 9.0,
                                                                   step_mode=step_mode),
            "OutlierAwareThresholdNode, no clamp": OutlierAwareThresholdNode(table(4.0), table(16.0), 3.0,
                                                                             step_mode=step_mode)}


def both_paths(layer: torch.nn.Module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """(kernels' output and input gradient, the composition's), the kernels on the host runner."""
    original, ran = few_spike.run, []

    def on_host(*args, **kwargs):
        ran.append(original(*args, **{**kwargs, "backend": "host"}))
        return ran[-1]

    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=F64).to(x.dtype)
    results = []
    for run in (on_host, lambda *args, **kwargs: None):
        monkeypatch.setattr(few_spike, "run", run)
        out = layer(x)
        results.append((out, torch.autograd.grad((out * weights).sum(), x)[0]))
    assert ran and ran[0] is not None, "the kernels ran the call"
    return results


DTYPES = (torch.float64, torch.float32, torch.bfloat16)
FULL = [(name, mode, dtype) for name in layers("s") for mode in ("m", "s") for dtype in DTYPES]
# By default a covering set (the full product with --slow): each layer in both step modes, each step mode in every
# dtype, each dtype with an unsigned and a signed (OutlierAwareThresholdNode's) kernel
COVERING = [("FewSpikeNode", "m", torch.float64), ("FewSpikeNode", "s", torch.bfloat16),
            ("HGNode", "m", torch.bfloat16), ("HGNode", "s", torch.float32),
            ("OutlierAwareThresholdNode", "m", torch.float32), ("OutlierAwareThresholdNode", "s", torch.float64),
            ("OutlierAwareThresholdNode, no clamp", "m", torch.float64),
            ("OutlierAwareThresholdNode, no clamp", "s", torch.bfloat16)]
CASES = FULL if profile() == "slow" else COVERING


def _on_host(name: str, step_mode: str, dtype: torch.dtype) -> None:
    """The kernels' call of a layer of `layers` and its input gradient, on the host runner."""
    layer = layers(step_mode)[name].to(dtype if dtype == F64 else torch.float32)
    x = torch.zeros((4, 3, 11) if step_mode == "m" else (3, 11), dtype=dtype, requires_grad=True)
    original = few_spike.run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(few_spike, "run", lambda *args, **kwargs: original(*args, **{**kwargs, "backend": "host"}))
        torch.autograd.grad(layer(x).sum(), x)


def _second_derivative_call() -> None:
    x = torch.zeros(4, 5, dtype=F64, requires_grad=True)
    out = few_spike.run(x, torch.ones(1, 4, dtype=F64), torch.ones(1, 4, dtype=F64), torch.ones(1, 4, dtype=F64),
                        torch.empty(0, dtype=F64), Sigmoid(), True, backend="host")
    torch.autograd.grad(out.sum(), x, create_graph=True)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels of the tests' calls, compiled up front many to a compiler run (`conftest.compile_launched`): the
    calls would compile them one a run."""
    runs = {*CASES, ("HGNode", "s", F64), ("OutlierAwareThresholdNode", "s", F64)}
    return compile_launched(*(functools.partial(_on_host, *run) for run in sorted(runs, key=str)),
                            _second_derivative_call)


def test_the_covering_set_holds_its_pairs():
    def pairs(cases):
        return ({(n, m) for n, m, _ in cases}, {(m, d) for _, m, d in cases},
                {(n.startswith("Outlier"), d) for n, _, d in cases})

    assert set(COVERING) <= set(FULL) and pairs(COVERING) == pairs(FULL)


@pytest.mark.parametrize(("name", "step_mode", "dtype"), CASES, ids=[f"{n}-{m}-{str(d)[6:]}" for n, m, d in CASES])
def test_the_kernels_equal_the_composition(name, step_mode, dtype, monkeypatch):
    layer = layers(step_mode)[name].to(dtype if dtype == F64 else torch.float32)
    shape = (4, 3, 11) if step_mode == "m" else (3, 11)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=F64) * 3).to(dtype).requires_grad_()
    (got, got_grad), (want, want_grad) = both_paths(layer, x, monkeypatch)
    assert got.dtype == want.dtype  # HGNode: promoted with its float32 tables, as the composition does
    if dtype == F64:
        assert torch.equal(got, want)
    else:  # the composition rounds the gate and each step in the dtype: an output flips where v meets θ within it
        assert (got != want).float().mean().item() < 0.05
    error = (got_grad.double() - want_grad.double()).norm() / want_grad.double().norm()
    assert error <= TOLERANCE[dtype]


def test_a_region_between_thresholds_picks_its_table(monkeypatch):
    """Gates below, between and above HGNode's thresholds, and on them (a gate equal to a threshold is in the region
    below it, as torch.bucketize's)."""
    layer = layers("s")["HGNode"].to(F64)
    x = torch.tensor([-3.0, 0.0, 0.5, 4.0, 5.0, 30.0], dtype=F64, requires_grad=True)
    (got, _), (want, _) = both_paths(layer, x, monkeypatch)
    assert torch.equal(got, want)


def test_an_outlier_node_clamps_and_splits_at_its_bounds(monkeypatch):
    """Gates at and around the clamp (±9: the clamp passes its bounds' gradient) and the split (3: the inlier table
    up to it), of both signs, and zero (no sign: no output, no gradient)."""
    layer = layers("s")["OutlierAwareThresholdNode"].to(F64)
    x = torch.tensor([-12.0, -9.0, -3.0, -2.5, 0.0, 2.5, 3.0, 3.5, 9.0, 12.0], dtype=F64, requires_grad=True)
    (got, got_grad), (want, want_grad) = both_paths(layer, x, monkeypatch)
    assert torch.equal(got, want) and torch.allclose(got_grad, want_grad, rtol=1e-13, atol=1e-15)


def test_a_table_made_learnable_gets_its_gradient(monkeypatch):
    """The kernels differentiate x alone: a layer whose table a user made a parameter takes the composition, whose
    autograd gives the table its gradient too."""
    layer = FewSpikeNode(table(4.0), step_mode="m").to(F64)
    layer.theta = torch.nn.Parameter(layer.theta.clone())
    original = few_spike.run
    monkeypatch.setattr(few_spike, "run", lambda *args, **kwargs: original(*args, **{**kwargs, "backend": "host"}))
    out = layer(torch.randn(4, 6, dtype=F64) * 3)
    (grad,) = torch.autograd.grad(out.sum(), layer.theta)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["primitive surrogate", "cpu without host", "a sequence of another length"])
def test_calls_the_kernels_do_not_run_get_none(case):
    tables = (torch.ones(1, 4), torch.ones(1, 4), torch.ones(1, 4), torch.empty(0))
    x, surrogate, backend = torch.randn(4, 5), Sigmoid(), "host"
    if case == "primitive surrogate":
        surrogate = Sigmoid(spiking=False)
    elif case == "cpu without host":
        backend = None
    else:
        x = torch.randn(3, 5)
    assert few_spike.run(x, *tables, surrogate, True, backend=backend) is None


def test_a_second_derivative_through_the_kernels_is_refused():
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    out = few_spike.run(x, torch.ones(1, 4, dtype=F64), torch.ones(1, 4, dtype=F64), torch.ones(1, 4, dtype=F64),
                        torch.empty(0, dtype=F64), Sigmoid(), True, backend="host")
    grad_x, = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative"):  # a gradient penalty
        ((grad_x ** 2).sum() + (x ** 2).sum()).backward()
