"""NIR import on a GPU: the fused kernels of the NIR specs against the torch reference (autocuda.nir)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

from autocuda.nir import from_nir  # noqa: E402

pytestmark = pytest.mark.gpu
DT = 1e-4


def _graph(rng: np.random.Generator, recurrent: bool) -> nir.NIRGraph:
    n = 64
    tau = rng.uniform(2e-4, 8e-4, n)
    nodes = {"input": nir.Input(np.array([32])), "fc": nir.Affine(rng.normal(size=(n, 32)) / 4, np.zeros(n)),
             "lif": nir.LIF(tau=tau, r=tau / DT, v_leak=np.zeros(n), v_threshold=np.ones(n), v_reset=np.zeros(n)),
             "fc2": nir.Linear(rng.normal(size=(16, n)) / 8),
             "cuba": nir.CubaLIF(tau_syn=np.full(16, 3e-4), tau_mem=rng.uniform(2e-4, 6e-4, 16), r=np.ones(16),
                                 v_leak=np.zeros(16), v_threshold=np.full(16, 0.2), v_reset=np.zeros(16),
                                 w_in=np.full(16, 2.0)),
             "output": nir.Output(np.array([16]))}
    edges = [("input", "fc"), ("fc", "lif"), ("lif", "fc2"), ("fc2", "cuba"), ("cuba", "output")]
    if recurrent:
        nodes["rec"] = nir.Linear(rng.normal(size=(n, n)) / 8)
        edges += [("lif", "rec"), ("rec", "lif")]
    return nir.NIRGraph(nodes=nodes, edges=edges, type_check=False)


@pytest.mark.parametrize("method", ["euler", "exact"])
@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_kernels_match_reference(method: str, recurrent: bool, dtype: torch.dtype) -> None:
    graph = _graph(np.random.default_rng(0), recurrent)
    x = torch.rand(16, 8, 32, dtype=dtype) * 2
    ours = from_nir(graph, dtype=dtype, method=method).cuda()
    reference = from_nir(graph, dtype=dtype, method=method, backend="reference")
    x_cuda = x.cuda().requires_grad_()
    x_ref = x.clone().requires_grad_()
    out, expected = ours(x_cuda), reference(x_ref)
    assert expected.sum() > 0
    agreement = (out.cpu() == expected).double().mean().item()
    assert agreement == 1.0 if dtype == torch.float64 else agreement > 0.99
    out.sum().backward()
    expected.sum().backward()
    if dtype == torch.float64:
        torch.testing.assert_close(x_cuda.grad.cpu(), x_ref.grad, rtol=1e-9, atol=1e-9)
