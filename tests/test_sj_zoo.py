"""SpikingJelly's model zoo with our neurons: spiking_vgg11_bn, sew_resnet18 and spiking_resnet18 built once with
SpikingJelly's LIFNode / ParametricLIFNode / IFNode and once with ours, from the same weights, give the same
outputs and weight gradients in float64 (our layers on the torch reference and on the generated kernels through
the host runner), over two training steps with `functional.reset_net` between them and truncated BPTT
(`functional.detach_net`) inside each. By default each model runs on one of our backends (both taken); with --slow
each on both.

The nets are built on the meta device and VGG's 4096-wide classifier is narrowed before any weight is made:
the test is about the neurons inside the nets, and stays fast on a CPU."""
from __future__ import annotations

import functools
import sys
import types

import pytest
import torch
from conftest import profile
from torch import nn

import autocuda.nn as our
from autocuda.toolchain.host import cxx as toolchain


def _stub_torchvision() -> None:
    """The zoo imports torchvision only for its download helper (never called here): a stand-in, for this test."""
    if "torchvision" in sys.modules:
        return
    names = ("torchvision", "torchvision.models", "torchvision.models.utils")
    modules = {name: types.ModuleType(name) for name in names}
    modules["torchvision.models.utils"].load_state_dict_from_url = None  # type: ignore[attr-defined]
    modules["torchvision"].models = modules["torchvision.models"]  # type: ignore[attr-defined]
    modules["torchvision.models"].utils = modules["torchvision.models.utils"]  # type: ignore[attr-defined]
    sys.modules.update(modules)


try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    _stub_torchvision()
    from spikingjelly.activation_based import functional, layer, surrogate
    from spikingjelly.activation_based import neuron as sj_neuron
    from spikingjelly.activation_based.model import sew_resnet, spiking_resnet, spiking_vgg
except Exception as error:
    pytest.skip(f"SpikingJelly's model zoo does not import: {type(error).__name__}: {error}",
                allow_module_level=True)

F64 = torch.float64
WIDTH = 16  # VGG's classifier width here (4096 in the zoo)
# model, its builder's extra arguments, the input's side
MODELS = {"spiking_vgg11_bn": (spiking_vgg.spiking_vgg11_bn, {}, 32),
          "sew_resnet18": (sew_resnet.sew_resnet18, {"cnf": "ADD"}, 8),
          "spiking_resnet18": (spiking_resnet.spiking_resnet18, {}, 8)}
CASES = [("spiking_vgg11_bn", "LIFNode"), ("sew_resnet18", "ParametricLIFNode"), ("spiking_resnet18", "IFNode")]


def build(model: str, node: type, device: str = "cpu", dtype: torch.dtype = F64) -> nn.Module:
    fn, extra, _ = MODELS[model]
    with torch.device("meta"):
        net = fn(spiking_neuron=node, surrogate_function=surrogate.ATan(), detach_reset=True, num_classes=3,
                 **extra)
        if model == "spiking_vgg11_bn":
            net.classifier[0] = layer.Linear(512 * 7 * 7, WIDTH)
            net.classifier[3] = layer.Linear(WIDTH, WIDTH)
            net.classifier[6] = layer.Linear(WIDTH, 3)
    net = net.to_empty(device=device)
    return net.to(dtype)


def initialize(net: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in net.state_dict().items():
            if name.endswith("num_batches_tracked"):
                tensor.zero_()
            elif name.endswith("running_var"):
                tensor.fill_(1.0)
            elif name.endswith(".w"):  # ParametricLIF: 1/tau = sigmoid(w), init_tau = 2
                tensor.zero_()
            else:
                fan_in = tensor[0].numel() if tensor.dim() > 1 else 1
                values = torch.randn(tensor.shape, generator=generator, dtype=F64) / fan_in ** 0.5
                tensor.copy_(values + (1.0 if name.endswith("bn1.weight") or name.endswith("bn2.weight") else 0.0))


@functools.cache
def initial_state(model: str, node: str) -> dict[str, torch.Tensor]:
    """The weights both nets start from: SpikingJelly's net, initialised (made once per case)."""
    theirs = build(model, getattr(sj_neuron, node))
    initialize(theirs, 0)
    return theirs.state_dict()


def starting_net(model: str, node: type) -> nn.Module:
    """A net of `node` layers (SpikingJelly's or ours) with the case's initial weights, in multi-step mode."""
    net = build(model, node)
    net.load_state_dict(initial_state(model, node.__name__))
    functional.set_step_mode(net, "m")
    return net


def train(net: nn.Module, x: torch.Tensor, chunks: int, lr: float = 0.05) -> list[tuple[torch.Tensor, dict]]:
    """Two training steps (SGD), each over x [T, ...] in `chunks` chunks of truncated BPTT; per step the
    outputs and the weight gradients."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    record = []
    for step in range(2):
        functional.reset_net(net)
        optimizer.zero_grad()
        outputs = []
        torch.manual_seed(step)  # dropout draws the same masks in both nets
        for chunk in x.chunk(chunks):
            out = net(chunk)
            out.pow(2).mean().backward()
            functional.detach_net(net)
            outputs.append(out.detach())
        record.append((torch.cat(outputs), {n: p.grad.clone() for n, p in net.named_parameters()}))
        optimizer.step()
    return record


def _input(model: str) -> torch.Tensor:
    side = MODELS[model][2]
    return 2 * torch.rand(2, 2, 3, side, side, dtype=F64, generator=torch.Generator().manual_seed(1))


@functools.cache
def trained_theirs(model: str, node: str) -> list[tuple[torch.Tensor, dict]]:
    """SpikingJelly's net's training record: the same for both backends of ours, so made once."""
    return train(starting_net(model, getattr(sj_neuron, node)), _input(model), 2)


BACKENDS = ("reference", "host")
# The default profile trains each model (and its neuron) once, on one of our backends, both backends taken: the
# learnable neuron and the plain ones on the generated kernels, a net with BatchNorm on the reference; with --slow
# every model on every backend. (Each training is seconds of float64 convolutions that the neurons do not change.)
DEFAULT_BACKEND = {"spiking_vgg11_bn": "reference", "sew_resnet18": "host", "spiking_resnet18": "host"}
RUNS = [(model, node, backend) for model, node in CASES for backend in BACKENDS
        if profile() == "slow" or DEFAULT_BACKEND[model] == backend]


def test_the_default_runs_cover_every_model_and_backend() -> None:
    assert {model for model, _, _ in RUNS} == set(MODELS) and {node for _, node, _ in RUNS} == {n for _, n in CASES}
    assert {backend for _, _, backend in RUNS} == set(BACKENDS)
    assert len(RUNS) == (len(CASES) * len(BACKENDS) if profile() == "slow" else len(CASES))


@pytest.mark.parametrize(("model", "node", "backend"), [
    pytest.param(*run, marks=pytest.mark.skipif(run[2] == "host" and toolchain.missing() is not None,
                                                reason=f"host runner: {toolchain.missing()}")) for run in RUNS])
def test_zoo_model_with_our_neurons_trains_as_theirs(model: str, node: str, backend: str) -> None:
    mine = starting_net(model, getattr(our, node))
    for module in mine.modules():
        if isinstance(module, our.Neuron):
            module.backend = backend  # the torch reference, or the generated kernels run on the CPU
    expected, got = trained_theirs(model, node), train(mine, _input(model), 2)
    for (out_a, grads_a), (out_b, grads_b) in zip(expected, got):
        torch.testing.assert_close(out_b, out_a)
        assert grads_a.keys() == grads_b.keys()
        for name in grads_a:
            torch.testing.assert_close(grads_b[name], grads_a[name], msg=name)
    first = next(iter(got[0][1].values()))  # the first conv's: the gradient passed every neuron layer
    assert first.abs().sum() > 0
