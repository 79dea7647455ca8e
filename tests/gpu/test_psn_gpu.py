"""The parallel spiking neurons on a GPU, in every dtype: ours (the mixing kernels, `autocuda.call.mixing`) against
SpikingJelly 2.0's own classes on the same device and dtype (one multi-step call and its backward; AMP-style half
inputs included), and a CUDA float32 call against the CPU float64 one from the same inputs. The kernels compute H in
float32 for half inputs, where SpikingJelly's `addmm` rounds it to the half type: a spike differs only where H lies
within that rounding of the threshold."""
from __future__ import annotations

import pytest
import torch
from conftest import deterministic_algorithms

import autocuda.nn as our
from autocuda.call import mixing
from autocuda.spec.surrogate import ATan

pytestmark = pytest.mark.gpu

sj_psn = pytest.importorskip("spikingjelly.activation_based.neuron.psn", reason="SpikingJelly 2.0 is a test extra")

CUDA = torch.device("cuda")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
LAYERS = [("PSN", (6,), {}), ("MaskedPSN", (2, 6), {"lambda_init": 0.5, "step_mode": "m"}),
          ("SlidingPSN", (3,), {"step_mode": "m"})]


def built(name: str, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    theirs = getattr(sj_psn, name)(*args, **kwargs).to(CUDA, dtype)
    torch.manual_seed(0)
    ours = getattr(our, name)(*args, **kwargs).to(CUDA, dtype)
    return theirs, ours


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "args", "kwargs"), LAYERS, ids=[layer[0] for layer in LAYERS])
def test_as_spikingjelly_on_cuda(name: str, args: tuple, kwargs: dict, dtype: torch.dtype,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    theirs, ours = built(name, args, kwargs, dtype)
    x = (torch.randn(6, 32, 129, device=CUDA) * 1.5).to(dtype).requires_grad_(True)
    fired, original = [], mixing.fire
    monkeypatch.setattr(mixing, "fire", lambda *a, **k: fired.append(original(*a, **k)) or fired[-1])
    a, b = theirs(x), ours(x)
    assert fired and all(f is not None for f in fired), "the mixing kernels ran the call"
    assert torch.equal(a, b) if dtype == torch.float64 else (a != b).float().mean().item() < 2e-3
    g = torch.randn_like(a)
    grads_theirs = torch.autograd.grad(a, [x, *theirs.parameters()], g)
    grads_ours = torch.autograd.grad(b, [x, *ours.parameters()], g)
    # each formula of the surrogate's gradient rounds in the dtype; the weights' gradients sum thousands of such
    # products, so in half precision they are compared as whole tensors (relative to their norm)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
    for p, q in zip(grads_theirs, grads_ours):
        p, q = p.double(), q.double()
        assert (q - p).norm() <= tolerance * p.norm() + 1e-30


@pytest.mark.parametrize(("name", "args", "kwargs"), LAYERS, ids=[layer[0] for layer in LAYERS])
def test_cuda_against_cpu_float64(name: str, args: tuple, kwargs: dict) -> None:
    torch.manual_seed(0)
    ours = getattr(our, name)(*args, **kwargs)
    x = torch.randn(6, 4, 33) * 1.5
    on_gpu = ours.to(CUDA)(x.to(CUDA))
    on_cpu = ours.to("cpu", torch.float64)(x.double())
    mismatched = (on_gpu.cpu().double() != on_cpu).float().mean().item()
    assert mismatched < 1e-3  # spikes flip only where h lands within float32's rounding of the threshold


@pytest.mark.parametrize("steps", [4, 8])
def test_the_fused_backward_sums_many_neurons_a_thread(steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """More neurons than the fused backward kernel's grid has threads (each thread sums several): its gradients of x,
    the weights and the biases equal those of the kernel writing grad_h with torch's matrix product (taken under
    torch's deterministic algorithms), in float64."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS under deterministic algorithms asks for it
    threads = mixing.GRID_STRIDE_BLOCKS * torch.cuda.get_device_properties(CUDA).multi_processor_count * 256
    generator = torch.Generator(CUDA).manual_seed(0)
    rows = torch.randn(steps, 3 * threads + 17, device=CUDA, dtype=torch.float64, generator=generator)
    weight = torch.randn(steps, steps, device=CUDA, dtype=torch.float64, generator=generator)
    bias = torch.randn(steps, 1, device=CUDA, dtype=torch.float64, generator=generator)
    grad = torch.randn(rows.shape, device=CUDA, dtype=torch.float64, generator=generator)
    results = []
    for deterministic in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (rows, weight, bias)]
        with deterministic_algorithms(deterministic):
            out = mixing.fire(*leaves, ATan())
            results.append(torch.autograd.grad(out, leaves, grad))
    for fused, reference in zip(*results):
        assert torch.allclose(fused, reference, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weights_at_an_unaligned_offset_on_cuda(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Float32 weights and biases that are views at an offset the kernels' 16-byte reads do not allow (a GPU faults
    on a misaligned vector read; the call copies them aligned first): the spikes and gradients of the same values in
    tensors of their own, through the fused backward (many neurons a thread) and the one writing grad_h."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS under deterministic algorithms asks for it
    generator = torch.Generator(CUDA).manual_seed(0)
    rows = (torch.randn(8, 300_001, device=CUDA, generator=generator) * 1.5).to(dtype)
    values = torch.randn(1 + 64 + 8, device=CUDA, generator=generator)
    grad = torch.randn(rows.shape, device=CUDA, generator=generator).to(dtype)
    for deterministic in (False, True):
        store = values.clone().requires_grad_(True)
        weight, bias = store[1:65].view(8, 8), store[65:].view(8, 1)
        assert weight.data_ptr() % 16 and bias.data_ptr() % 16
        own_weight = values[1:65].view(8, 8).clone().requires_grad_(True)
        own_bias = values[65:].view(8, 1).clone().requires_grad_(True)
        with deterministic_algorithms(deterministic):
            offset = mixing.fire(rows, weight, bias, ATan())
            own = mixing.fire(rows, own_weight, own_bias, ATan())
            assert offset is not None and torch.equal(offset, own)
            got = torch.autograd.grad(offset, [store], grad)[0]
            want = torch.autograd.grad(own, [own_weight, own_bias], grad)
        for g, w in zip((got[1:65].view(8, 8), got[65:].view(8, 1)), want):
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_two_neurons_a_thread_give_one_neurons_values_on_cuda(dtype: torch.dtype,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of an even length at an aligned address go two neurons to a thread (one access for a pair), the same rows
    at an odd offset one neuron a thread: the same spikes and grad_x bit for bit, the weights' and biases'
    gradients within rounding, through the fused backward (many words a thread) and the one writing grad_h."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS under deterministic algorithms asks for it
    generator = torch.Generator(CUDA).manual_seed(0)
    neurons = 2 * 150_001
    rows = (torch.randn(8, neurons, device=CUDA, generator=generator) * 1.5).to(dtype)
    store = torch.empty(1 + rows.numel(), device=CUDA, dtype=dtype)
    store[1:] = rows.flatten()
    shifted = store[1:].view(8, neurons)
    assert mixing.word_lanes(rows) == 2 and mixing.word_lanes(shifted) == 1
    weight = torch.randn(8, 8, device=CUDA, generator=generator)
    bias = torch.randn(8, 1, device=CUDA, generator=generator)
    grad = torch.randn(rows.shape, device=CUDA, generator=generator).to(dtype)
    for deterministic in (False, True):
        results = []
        for given in (rows, shifted):
            leaves = [t.clone().requires_grad_(True) if t is not shifted else t.detach().requires_grad_(True)
                      for t in (given, weight, bias)]
            with deterministic_algorithms(deterministic):
                out = mixing.fire(*leaves, ATan())
                results.append((out, *torch.autograd.grad(out, leaves, grad)))
        (spikes, grad_x, grad_w, grad_b), (spikes_1, grad_x_1, grad_w_1, grad_b_1) = results
        assert torch.equal(spikes, spikes_1) and torch.equal(grad_x, grad_x_1)
        for got, want in ((grad_w, grad_w_1), (grad_b, grad_b_1)):
            assert (got - want).norm() <= 1e-5 * want.norm()
