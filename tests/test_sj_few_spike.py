"""SpikingJelly's few-spike neurons (autocuda.nn.spikingjelly_few_spike) in float64 on the CPU against SpikingJelly's
own classes: buffers (names, shapes, dtypes), outputs and input gradients in both step modes, with our tables and
theirs and with our surrogates and theirs; the refusals (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our
import autocuda.spec.surrogate as ours

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import surrogate as sj_surrogate
    from spikingjelly.activation_based.neuron import few_spike as sj_few
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
K = 4


def columns(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    theta = torch.sort(torch.rand(K, generator=g, dtype=F64), descending=True).values
    return theta, theta * (0.8 + 0.4 * torch.rand(K, generator=g, dtype=F64)), torch.rand(K, generator=g, dtype=F64)


def tables(module, seeds):
    return [module.FewSpikeTable(*columns(seed)) for seed in seeds]


def build(name: str, module, surrogate, step_mode: str, table_module=None) -> torch.nn.Module:
    """`module`'s class `name` of `table_module`'s tables (`module`'s by default)."""
    made = module if table_module is None else table_module
    if name == "FewSpikeNode":
        return module.FewSpikeNode(*tables(made, [1]), surrogate, step_mode)
    if name == "OutlierAwareThresholdNode":
        return module.OutlierAwareThresholdNode(*tables(made, [1, 2]), 0.6, 1.5, surrogate, step_mode)
    return module.HGNode(tables(made, [1, 2, 3]), [-0.2, 0.5], surrogate, step_mode)


def twin_inputs(step_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = 1.2 * torch.randn(*((K,) if step_mode == "m" else ()), 5, 7, dtype=F64)
    return x.clone().requires_grad_(True), x.clone().requires_grad_(True)


NAMES = ["FewSpikeNode", "OutlierAwareThresholdNode", "HGNode"]


@pytest.mark.parametrize(("table_from", "surrogate"), [("ours", "ours"), ("theirs", "theirs")])
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("name", NAMES)
def test_few_spike_nodes_as_theirs(name: str, step_mode: str, table_from: str, surrogate: str) -> None:
    theirs = build(name, sj_few, sj_surrogate.Sigmoid(alpha=3.0), step_mode)
    mine = build(name, our, ours.Sigmoid(alpha=3.0) if surrogate == "ours" else sj_surrogate.Sigmoid(alpha=3.0),
                 step_mode, our if table_from == "ours" else sj_few)
    buffers = dict(theirs.named_buffers())
    assert [n for n, _ in mine.named_buffers()] == list(buffers) and mine.K == theirs.K == K
    for n, value in mine.named_buffers():
        assert value.dtype == buffers[n].dtype and torch.equal(value, buffers[n]), n
    x, y = twin_inputs(step_mode)
    a, b = theirs(x), mine(y)
    torch.testing.assert_close(b, a, rtol=1e-13, atol=1e-13)
    assert a.abs().sum() > 0 and (a == 0).any()  # some fired, some did not
    weights = torch.arange(a.numel(), dtype=F64).view_as(a)
    (a * weights).sum().backward(), (b * weights).sum().backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("build_bad", "error", "words"), [
    (lambda: our.FewSpikeTable([1.0, 0.5], [1.0], [1.0, 1.0]), ValueError, "one shape"),
    (lambda: our.FewSpikeTable([[1.0]], [1.0], [1.0]), ValueError, "^theta"),
    (lambda: our.FewSpikeTable([], [], []), ValueError, "^theta.*empty"),
    (lambda: our.FewSpikeTable([float("inf")], [1.0], [1.0]), ValueError, "^theta.*finite"),
    (lambda: our.FewSpikeNode("table"), TypeError, "^table"),
    (lambda: our.FewSpikeNode(our.FewSpikeTable([1.0], [1.0], [1.0]), step_mode="x"), ValueError, "^step_mode"),
    (lambda: our.FewSpikeNode(our.FewSpikeTable([1.0], [1.0], [1.0]))(torch.zeros(3, dtype=torch.int64)),
     TypeError, "^x: expected a floating"),
    (lambda: our.FewSpikeNode(our.FewSpikeTable([1.0], [1.0], [1.0]), step_mode="m")(torch.zeros(3, 2)),
     ValueError, "K = 1"),
    (lambda: our.OutlierAwareThresholdNode(*tables(our, [1]) * 2, -1.0), ValueError, "^split_threshold"),
    (lambda: our.OutlierAwareThresholdNode(*tables(our, [1]) * 2, 1.0, 0.5), ValueError, "^clamp_value"),
    (lambda: our.OutlierAwareThresholdNode(tables(our, [1])[0], our.FewSpikeTable([1.0], [1.0], [1.0]), 1.0),
     ValueError, "^outlier_table: must have K = 4"),
    (lambda: our.HGNode([], []), ValueError, "^tables"),
    (lambda: our.HGNode(tables(our, [1, 2]), [0.1, 0.2]), ValueError, "^gate_thresholds.*len"),
    (lambda: our.HGNode(tables(our, [1, 2, 3]), [0.3, 0.2]), ValueError, "^gate_thresholds.*increasing"),
])
def test_bad_input_is_refused_naming_it(build_bad, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        build_bad()
