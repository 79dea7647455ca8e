"""FewSpikeNode, HGNode and OutlierAwareThresholdNode on a GPU, in every dtype, by the few-spike kernels
(`autocuda.call.few_spike`), against
SpikingJelly 2.0's own classes: outputs and the input's gradient. float32 and float64 against theirs in the same
dtype; float16 and bfloat16 against theirs in float32 from the same inputs (the kernels compute in float32: their
composition in a half type rounds the gate and every step, so a region or a spike flips where one of those
roundings crosses a threshold; the bench's agreement column shows how often)."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our
from autocuda.call import few_spike

pytestmark = pytest.mark.gpu

sj_few = pytest.importorskip("spikingjelly.activation_based.neuron.few_spike",
                             reason="SpikingJelly 2.0 is a test extra")

CUDA = torch.device("cuda")
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
K = 6


def tables(module, scales):
    halves = torch.tensor([0.5 ** (k + 1) for k in range(K)], dtype=torch.float64)
    return [module.FewSpikeTable(halves * s, halves * s, halves * s) for s in scales]


def build(module, name: str, step_mode: str):
    if name == "FewSpikeNode":
        return module.FewSpikeNode(*tables(module, [4.0]), step_mode=step_mode)
    if name == "OutlierAwareThresholdNode":
        return module.OutlierAwareThresholdNode(*tables(module, [4.0, 16.0]), 3.0, 9.0, step_mode=step_mode)
    return module.HGNode(tables(module, [1.0, 4.0, 16.0]), [0.0, 4.0], step_mode=step_mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("name", ["FewSpikeNode", "HGNode", "OutlierAwareThresholdNode"])
def test_as_spikingjelly_on_cuda(name: str, step_mode: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
                                 ) -> None:
    half = dtype in (torch.float16, torch.bfloat16)
    theirs = build(sj_few, name, step_mode).to(CUDA, torch.float32 if half else dtype)
    ours = build(our, name, step_mode).to(CUDA, dtype)
    shape = (K, 64, 129) if step_mode == "m" else (64, 129)
    x = (torch.randn(shape, device=CUDA) * 4).to(dtype).requires_grad_(True)
    ran, original = [], few_spike.run
    monkeypatch.setattr(few_spike, "run", lambda *a, **k: ran.append(original(*a, **k)) or ran[-1])
    a, b = theirs(x.float() if half else x), ours(x)
    assert ran and ran[0] is not None, "the few-spike kernels ran the call"
    assert b.dtype == dtype
    kept = ~ambiguous(build(sj_few, name, step_mode), x, step_mode)  # neurons, over the steps
    assert kept.float().mean() > 0.99
    assert torch.equal(a.to(dtype)[..., kept], b[..., kept])
    g = torch.randn_like(a)
    p, q = (torch.autograd.grad(out, x, g.to(out.dtype))[0].double()[..., kept] for out in (a, b))
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}.get(dtype, 1e-2)
    assert (q - p).norm() <= tolerance * p.norm() + 1e-30


def ambiguous(reference: torch.nn.Module, x: torch.Tensor, step_mode: str) -> torch.Tensor:
    """The neurons ([64, 129]) whose outputs may differ between two correct sums of a sequence's K inputs: the
    kernels add them in order, torch's CUDA sum (SpikingJelly's gate) in its own order, each rounding in its own
    way (bench/results/2026-11-30-h200-gpu-suite-2). Every other step of both is exact (the tables hold powers of
    two), so a neuron counts where SpikingJelly's float64 composition on the CPU gives other outputs for the one
    gate than for the other."""
    if step_mode == "s":  # one input: the gate itself
        return torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    inputs = x.detach().to(torch.float64 if x.dtype == torch.float64 else torch.float32)  # the compute type
    in_order = inputs[0]
    for k in range(1, K):
        in_order = in_order + inputs[k]
    outputs = []
    for gate in (in_order, inputs.sum(0)):
        sequence = torch.zeros((K, *gate.shape), dtype=torch.float64)
        sequence[0] = gate.double().cpu()  # a sequence whose sum is this gate, exactly
        with torch.no_grad():
            outputs.append(reference(sequence))
    return (outputs[0] != outputs[1]).any(0).to(x.device)
