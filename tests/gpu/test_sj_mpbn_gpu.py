"""The MPBN LIF neuron on a GPU (`call.mpbn`'s kernels) in every dtype against the same layer composed of torch ops in
float64 on the CPU: spikes, final membrane, gradients and running statistics after two calls in a row."""
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
    weights = torch.linspace(-1.0, 1.0, spikes.numel(), dtype=x.dtype, device=x.device).view_as(spikes)
    grads = torch.autograd.grad((spikes * weights).sum() + (node.v.float() ** 2).sum(),
                                [first, second, *node.parameters()])
    return [spikes, node.v, *grads, node.vbn.running_mean, node.vbn.running_var]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kwargs", [{"out_channels": 16}, {"out_channels": 16, "v_reset": None, "decay_input": True}],
                         ids=["hard", "soft-decay"])
def test_mpbn_on_cuda_as_on_the_cpu(dtype: torch.dtype, kwargs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    kernels = mpbn.run
    monkeypatch.setattr(mpbn, "run", lambda *args: ran.append(kernels(*args)) or ran[-1])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, 16, 13, 17, generator=generator, dtype=F64) + 0.5
    nodes = [our.MPBNLIFNode(step_mode="m", **kwargs).to(F64), our.MPBNLIFNode(step_mode="m", **kwargs).to("cuda", dtype)]
    for node in nodes:
        with torch.no_grad():
            for p in node.parameters():
                p.copy_(torch.linspace(0.5, 1.5, p.numel()).view_as(p))
    nodes[0].backend = "torch"
    cpu, gpu = run(nodes[0], x), run(nodes[1], x.to("cuda", dtype))
    assert len(ran) == 4 and ran[2] is not None and ran[3] is not None  # the GPU's calls on the kernels
    differ = float((gpu[0].cpu().to(F64) != cpu[0]).double().mean())
    assert differ <= {F64: 0.0, torch.float32: 1e-4}.get(dtype, 1e-2), differ
    tolerance = {F64: 1e-11, torch.float32: 1e-4}.get(dtype, 6e-2)
    for a, b in zip(cpu[2:], gpu[2:]):
        assert b.dtype == dtype
        assert (b.cpu().to(F64) - a).norm() <= tolerance * (a.norm() + 1.0)
