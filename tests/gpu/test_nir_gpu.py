"""NIR import on a GPU: the fused kernels of the NIR specs against the torch reference (autocuda.nir)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

from autocuda.tools.nir import from_nir  # noqa: E402

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


def test_training_step_replays_from_a_cuda_graph() -> None:
    """Forward, backward and SGD step of an imported graph captured once in a CUDA graph: a replay on new data
    gives the eager step's loss and weights (nothing in the step needs the host)."""
    graph = _graph(np.random.default_rng(1), recurrent=False)
    eager, graphed = (from_nir(graph).cuda() for _ in range(2))
    x_static, target = torch.rand(16, 8, 32, device="cuda") * 2, torch.rand(8, 16, device="cuda")

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
        model.reset()
        loss = ((model(x).mean(0) - target) ** 2).sum()
        loss.backward()
        optimizer.step()
        return loss

    sgd = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, graphed)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, on the model that will be captured
        for _ in range(2):
            sgd[1].zero_grad(set_to_none=True)
            step(graphed, sgd[1], x_static)
    torch.cuda.current_stream().wait_stream(side)
    eager.load_state_dict(graphed.state_dict())
    capture = torch.cuda.CUDAGraph()
    sgd[1].zero_grad(set_to_none=True)
    with torch.cuda.graph(capture):
        loss_static = step(graphed, sgd[1], x_static)
    x_static.copy_(torch.rand_like(x_static) * 2)  # new data into the captured input
    eager.load_state_dict(graphed.state_dict())  # the capture ran no step: both start from the same weights
    capture.replay()
    sgd[0].zero_grad(set_to_none=True)
    expected = step(eager, sgd[0], x_static.clone())
    torch.testing.assert_close(loss_static, expected)
    for p_graphed, p_eager in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(p_graphed, p_eager)
    assert not torch.equal(next(graphed.parameters()), next(from_nir(graph).cuda().parameters()))


@pytest.mark.parametrize("kind", ["LIF", "IF"])
@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_kernels_spike_above_the_threshold_not_at_it(kind: str, recurrent: bool, dtype: torch.dtype) -> None:
    """NIR spikes where v > v_threshold (the specs' fires_at '>'): with dt = 2**-10 and inputs of ones, the
    membranes land exactly on their thresholds at the second step (LIF: 1, 1.5; IF: 1, 2), spike at the third,
    and repeat; the fused kernels (one over T, or single steps in a recurrent graph) give exactly that."""
    dt, n = 2.0**-10, 3
    neuron = (nir.LIF(tau=np.full(n, 2 * dt), r=np.full(n, 2.0), v_leak=np.zeros(n), v_threshold=np.full(n, 1.5),
                      v_reset=np.zeros(n)) if kind == "LIF" else
              nir.IF(r=np.full(n, 1 / dt), v_threshold=np.full(n, 2.0), v_reset=np.zeros(n)))
    nodes = {"input": nir.Input(np.array([n])), "neuron": neuron, "output": nir.Output(np.array([n]))}
    edges = [("input", "neuron"), ("neuron", "output")]
    if recurrent:  # a recurrent edge of zero weight: the graph steps one time step at a time
        nodes["rec"] = nir.Linear(np.zeros((n, n)))
        edges += [("neuron", "rec"), ("rec", "neuron")]
    model = from_nir(nir.NIRGraph(nodes=nodes, edges=edges, type_check=False), dt=dt, dtype=dtype).cuda()
    assert model.recurrent is recurrent
    with torch.no_grad():
        out = model(torch.ones(9, 2, n, dtype=dtype, device="cuda")).cpu()
    expected = torch.tensor([0.0, 0.0, 1.0] * 3, dtype=dtype).view(9, 1, 1).expand(9, 2, n)
    assert torch.equal(out, expected)
