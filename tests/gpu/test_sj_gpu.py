"""SpikingJelly's model zoo and neurons on a GPU, with our neurons running the generated kernels: the same nets
and steps as tests/test_sj_zoo.py (two training steps, reset_net between, truncated BPTT with detach_net), in
float32 against SpikingJelly's own neurons, within a tolerance (float32 sums in another order may move a
membrane across its threshold now and then); and the drop-in points of tests/test_interop.py on CUDA tensors."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _zoo():
    """tests/test_sj_zoo.py, whose nets and training loop this file runs on the GPU (skips without the zoo)."""
    path = Path(__file__).resolve().parent.parent / "test_sj_zoo.py"
    spec = importlib.util.spec_from_file_location("sj_zoo_cpu", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except pytest.skip.Exception as skipped:
        pytest.skip(str(skipped))
    return module


def relative(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    return float((a - b).norm() / b.norm().clamp_min(floor))


@pytest.fixture
def full_float32():
    """Convolutions and matrix products in float32 rather than TF32 for the test: TF32 results of two algorithms
    differ by about 1e-3 (the two nets' layers may get different ones for tensors of different strides), which
    flips spikes near the threshold, and a deep IF net carries every flip on; the comparison is of the neurons."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.usefixtures("full_float32")
@pytest.mark.parametrize(("model", "node"), [("spiking_vgg11_bn", "LIFNode"), ("sew_resnet18", "ParametricLIFNode"),
                                             ("spiking_resnet18", "IFNode")])
def test_zoo_model_with_our_kernels_trains_as_theirs(model: str, node: str) -> None:
    zoo = _zoo()
    theirs, mine = (zoo.starting_net(model, getattr(layers, node)).to(CUDA, torch.float32)
                    for layers in (zoo.sj_neuron, our))
    side = zoo.MODELS[model][2]
    x = 2 * torch.rand(4, 2, 3, side, side, device=CUDA, generator=torch.Generator(CUDA).manual_seed(1))
    expected, got = zoo.train(theirs, x, 2), zoo.train(mine, x, 2)
    for (out_a, grads_a), (out_b, grads_b) in zip(expected, got):
        assert relative(out_b, out_a) < 2e-2
        # A convolution's bias followed by BatchNorm in training mode has a gradient of exactly zero (the batch
        # mean removes it), so float32 leaves only rounding noise there: such gradients are measured against a
        # floor of 1e-3 of the largest gradient's norm instead of their own norm.
        floor = 1e-3 * max(float(g.norm()) for g in grads_a.values())
        for name in grads_a:
            assert relative(grads_b[name], grads_a[name], floor) < 5e-2, name


def test_truncated_bptt_store_v_seq_and_new_batch_on_cuda() -> None:
    functional = pytest.importorskip("spikingjelly.activation_based.functional",
                                     reason="needs SpikingJelly 2.0 (a test extra)")

    lif = our.LIFNode(step_mode="s", store_v_seq=True)
    w = torch.ones(5, device=CUDA, requires_grad=True)
    for chunk in torch.rand(4, 3, 5, device=CUDA).split(2):
        torch.stack([lif(t * w) for t in chunk]).sum().backward()
        functional.detach_net(lif)
    assert lif.v_seq.shape == (4, 3, 5) and not lif.v.requires_grad
    lif(torch.rand(2, 5, device=CUDA))  # a new batch size starts afresh
    assert lif.v.shape == (2, 5) and lif.v_seq.shape == (1, 2, 5)


def test_non_spiking_surrogate_is_refused_by_the_kernels() -> None:
    from autocuda.spec.surrogate import ATan

    with pytest.raises(ValueError, match="reference"):
        our.LIFNode(surrogate_function=ATan(spiking=False))(torch.rand(3, device=CUDA))


@pytest.mark.parametrize("name", ["CUBALIFNode", "KLIFNode", "RAFNode", "HalfThresholdIFNode", "SimpleLIFNode"])
def test_more_classes_kernels_match_the_reference(name: str) -> None:
    kwargs = {"tau": 2.0, "decay_input": True} if name == "SimpleLIFNode" else {}
    x = (1.5 * torch.randn(8, 4, 33, device=CUDA, dtype=torch.float64)).requires_grad_(True)
    y = x.detach().cpu().requires_grad_(True)
    gpu, cpu = getattr(our, name)(**kwargs).to(torch.float64), getattr(our, name)(**kwargs).to(torch.float64)
    gpu.step_mode = cpu.step_mode = "m"
    a, b = gpu.to(CUDA)(x), cpu(y)
    torch.testing.assert_close(a.cpu(), b)
    a.sum().backward(), b.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), y.grad)


VARIANTS = {"NonSpikingLIFNode": lambda: our.NonSpikingLIFNode(tau=3.0, decode="mean-mem"),
            "LIAFNode": lambda: our.LIAFNode(torch.nn.ReLU(), True, step_mode="m"),
            "ComplementaryLIFNode": lambda: our.ComplementaryLIFNode(step_mode="m", store_state_seqs=True),
            "TernaryIFNode": lambda: our.TernaryIFNode(step_mode="m"),
            "TernaryLIFNode": lambda: our.TernaryLIFNode(tau=3.0, v_reset=None, step_mode="m"),
            "ILIFNode": lambda: our.ILIFNode(step_mode="m")}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_classes_kernels_match_the_reference(name: str) -> None:
    """Outputs other than the spike (spec `output`), a reset written as updates and multi-level spikes (spec
    `levels`), on the generated kernels."""
    x = (1.5 * torch.randn(8, 4, 33, device=CUDA, dtype=torch.float64)).requires_grad_(True)
    y = x.detach().cpu().requires_grad_(True)
    gpu, cpu = VARIANTS[name]().to(torch.float64).to(CUDA), VARIANTS[name]().to(torch.float64)
    a, b = gpu(x), cpu(y)
    torch.testing.assert_close(a.cpu(), b)
    weights = torch.arange(b.numel(), dtype=torch.float64).view_as(b)
    (a * weights.to(CUDA)).sum().backward(), (b * weights).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), y.grad)
