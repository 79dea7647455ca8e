"""The MPBN LIF neuron on a GPU (`call.mpbn`'s kernels) in every dtype against the same layer composed of torch ops in
float64 on the CPU: spikes, final membrane, gradients and running statistics after two calls in a row. Below float64
a spike flipped by rounding moves its channel's statistics at that step and after, so the judge there is the
composition on the GPU in the same dtype: the kernels' distance from float64 within twice the composition's (plus
the dtype's rounding). Runs of 256 neurons of a channel are whole blocks: the kernels then sum per block."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our
from autocuda.call import mpbn

pytestmark = pytest.mark.gpu

F64 = torch.float64
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def run(node: our.MPBNLIFNode, x: torch.Tensor) -> list[torch.Tensor]:
    first, second = x[:4].clone().requires_grad_(True), x[4:].clone().requires_grad_(True)
    spikes = torch.cat([node(first), node(second)])
    # the loss in float32 and small: float16's sums of so many terms overflow
    weights = torch.linspace(-1.0, 1.0, spikes.numel(), device=x.device).view_as(spikes) / 256
    grads = torch.autograd.grad((spikes.float() * weights).sum() + (node.v.float() ** 2).sum() / 256,
                                [first, second, *node.parameters()])
    return [spikes, node.v, *grads, node.vbn.running_mean, node.vbn.running_var]


@pytest.mark.parametrize("spatial", [(13, 17), (16, 16)], ids=["warp-sums", "block-sums"])  # runs of 256: whole blocks
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kwargs", [{"out_channels": 16}, {"out_channels": 16, "v_reset": None, "decay_input": True}],
                         ids=["hard", "soft-decay"])
def test_mpbn_on_cuda_as_on_the_cpu(dtype: torch.dtype, kwargs: dict, spatial: tuple[int, int],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    kernels = mpbn.run
    monkeypatch.setattr(mpbn, "run", lambda *args: ran.append(kernels(*args)) or ran[-1])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, 16, *spatial, generator=generator, dtype=F64) + 0.5
    nodes = [our.MPBNLIFNode(step_mode="m", **kwargs).to(device, precision)
             for device, precision in (("cpu", F64), ("cuda", dtype), ("cuda", dtype))]
    for node, backend in zip(nodes, ("torch", None, "torch")):
        node.backend = backend
        with torch.no_grad():
            for p in node.parameters():
                p.copy_(torch.linspace(0.5, 1.5, p.numel()).view_as(p))
    exact, ours, composed = (run(node, x.to(node.vbn.weight.device, node.vbn.weight.dtype)) for node in nodes)
    assert [found is not None for found in ran] == [False, False, True, True, False, False]
    differ = float((ours[0].cpu().to(F64) != exact[0]).double().mean())
    assert differ <= {F64: 0.0, torch.float32: 1e-4}.get(dtype, 1e-2), differ
    for a, b, c in zip(exact[2:], ours[2:], composed[2:]):
        assert b.dtype == dtype
        error = float((b.cpu().to(F64) - a).norm() / (a.norm() + 1.0))
        if dtype == F64:
            assert error <= 1e-11, error
        else:
            composed_error = float((c.cpu().to(F64) - a).norm() / (a.norm() + 1.0))
            assert error <= 2 * composed_error + (1e-4 if dtype == torch.float32 else 1e-3), (error, composed_error)
