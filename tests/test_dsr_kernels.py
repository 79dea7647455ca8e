"""The DSR neurons' rate-rule kernels (`autocuda.call.dsr`, `codegen.dsr_kernel`), run on the CPU through the host
runner (`backend="host"`: the `dsr` spec's kernels for the spikes as well), in every dtype, against the same layers
composed of torch ops (`backend="torch"`) in float64 on the same inputs (the kernels compute in float or double, a
half dtype's composition in that dtype): the outputs, the input gradients and the threshold's gradient, for an
output gradient given in full and for an expanded one (a sum's); a trace by torch.compile, a CPU tensor without
`backend="host"`, composes."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched

from autocuda.call import dsr
from autocuda.nn import DSRIFNode, DSRLIFNode

F64 = torch.float64
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}
# The LIF's inputs around its rate bound, v_threshold / delta_t * tau = 8 (the IF's: eighths, in the test)
INPUTS = {DSRLIFNode: (2.0, 8.0)}


def layer(kind: type, backend: str, dtype: torch.dtype) -> torch.nn.Module:
    kwargs = {"delta_t": 0.25} if kind is DSRLIFNode else {}
    return kind(T=8, v_threshold=1.0, backend=backend, **kwargs).to(dtype)


DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def inputs(kind: type, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x and the output's weights for a layer of `kind` in `dtype`."""
    generator = torch.Generator().manual_seed(0)
    if kind is DSRIFNode:  # eighths: some neurons' rates are exactly 0 or 1, where the IF's closed bounds pass
        x = torch.randint(-4, 13, (8, 3, 67), generator=generator) / 8
        x[:, 0, :4] = torch.tensor([0.5, -0.5] * 4).view(8, 1)  # rate 0
        x[:, 1, :4] = torch.tensor([1.5, 0.5] * 4).view(8, 1)  # rate 1, the threshold
        x = x.to(dtype)
    else:
        low, high = INPUTS[kind]
        x = (torch.rand(8, 3, 67, generator=generator, dtype=F64) * 2 * high - high / 2 + low).to(dtype)
    return x, torch.randn(x.shape, generator=generator, dtype=F64).to(dtype)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the cases below, compiled up front many to a compiler run (`conftest.compile_launched`)."""
    def calls(kind: type, dtype: torch.dtype) -> None:
        leaf = inputs(kind, dtype)[0].requires_grad_(True)
        layer(kind, "host", dtype)(leaf).sum().backward()

    return compile_launched(*(functools.partial(calls, kind, dtype) for kind in (DSRIFNode, DSRLIFNode)
                              for dtype in DTYPES))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", [DSRIFNode, DSRLIFNode], ids=lambda k: k.__name__)
@pytest.mark.parametrize("expanded", [False, True], ids=["weighted", "sum"])
def test_kernels_equal_the_composition(kind: type, dtype: torch.dtype, expanded: bool) -> None:
    x, weights = inputs(kind, dtype)
    results = []
    for backend, precision in (("host", dtype), ("torch", F64)):  # the judge: the composition in float64
        node = layer(kind, backend, precision)
        leaf = x.to(precision).requires_grad_(True)
        out = node(leaf)
        loss = out.sum() if expanded else (out * weights.to(precision)).sum()
        results.append((out, *torch.autograd.grad(loss, [leaf, node.v_threshold])))
    tolerance = TOLERANCE[dtype]
    for ours, theirs in zip(*results):
        assert ours.dtype == dtype
        assert (ours.double() - theirs).norm() <= tolerance * (theirs.norm() + 1.0)


def test_the_kernels_run_host_calls_and_leave_the_rest_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.rand(4, 10, dtype=F64)
    spikes = (x > 0.5).to(F64)
    v_th = torch.tensor(2.0, dtype=F64)
    out = dsr.scaled_spikes(spikes, v_th, 4.0, "host")
    assert out is not None and torch.equal(out, spikes * 0.5)
    assert dsr.scaled_spikes(spikes, v_th, 4.0, None) is None  # a CPU tensor: the device's default runs no kernel
    found = dsr.backward(x, torch.ones_like(x), v_th, [1.0] * 4, 1.0, 4.0, False, "host")
    assert found is not None and found[0].shape == x.shape and found[1].shape == (10,)
    assert dsr.backward(x, torch.ones_like(x), v_th, [1.0] * 3, 1.0, 4.0, False, "host") is None  # T weights
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # a trace: Dynamo would stop at the launch
    assert dsr.scaled_spikes(spikes, v_th, 4.0, "host") is None


def test_the_if_output_is_written_by_its_spike_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSRIFNode's forward on the kernels: the `dsr` spec's kernels write its output, s v_threshold, in place of the
    spike (no output kernel reads the spikes back), equal to the composition; the LIF's output (s v_threshold /
    delta_t) takes the output kernel."""
    x = inputs(DSRIFNode, F64)[0]
    expected = DSRIFNode(T=8, v_threshold=0.75, backend="torch").to(F64)(x)
    monkeypatch.setattr(dsr, "scaled_spikes", lambda *args: pytest.fail("the IF's output took the output kernel"))
    out = DSRIFNode(T=8, v_threshold=0.75, backend="host").to(F64)(x)
    assert torch.equal(out, expected) and int((out == 0.75).sum()) > 0
    with pytest.raises(pytest.fail.Exception, match="output kernel"):
        layer(DSRLIFNode, "host", F64)(inputs(DSRLIFNode, F64)[0])
