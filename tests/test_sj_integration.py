"""Our layers inside SpikingJelly 2.0's machinery, in float64 against SpikingJelly's own classes with the same
weights: its `functional` (reset_net, detach_net, set_step_mode, multi_step_forward, seq_to_ann_forward,
chunk_multi_step_forward, t_last_multi_step_forward, first_spike_index, spike_similar_loss, the conv-BN fx
transforms), its `layer` containers and step-mode layers, its `monitor` classes hooked onto our layers, its
`memopt.checkpoint_module` and its `base` free functions; several training sequences with a reset between them and
detach_net between chunks. Regression tests for the faults found here: a `step_mode` of another value taken by our
spec layers without a word (SpikingJelly's refuses it at once), our PSN and BatchNormNeuron traced into by
SpikingJelly's conv-BN fx transforms (their tracer keeps `base.StepModule`s whole; ours were none), and
`supported_step_mode()` that did not say what the setter takes (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import copy
import importlib
import sys
import types

import pytest
import torch
from backends import CPU_BACKENDS
from conftest import profile
from torch import nn

import autocuda.nn as our

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import base, layer, memopt
    from spikingjelly.activation_based import functional as F
    from spikingjelly.activation_based import neuron as sj
    from spikingjelly.activation_based import surrogate as sg
    from spikingjelly.activation_based.functional.conv_bn_fusion import (
        fuse_conv_bn_eval_modules,
        pack_conv_bn_train_modules,
    )
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)


def _import_monitor() -> types.ModuleType:
    """SpikingJelly's monitor module, which imports tensorboard's SummaryWriter (for its GPUMonitor only): a stand-in
    while it imports where tensorboard is not installed (removed again after)."""
    try:
        importlib.import_module("torch.utils.tensorboard")
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = object  # type: ignore[attr-defined]
        sys.modules["torch.utils.tensorboard"] = stub
        try:
            sys.modules.pop("spikingjelly.activation_based.monitor", None)
            return importlib.import_module("spikingjelly.activation_based.monitor")
        finally:
            if sys.modules.get("torch.utils.tensorboard") is stub:
                del sys.modules["torch.utils.tensorboard"]
    return importlib.import_module("spikingjelly.activation_based.monitor")


monitor = _import_monitor()
pytestmark = pytest.mark.usefixtures("native_on_host")  # host calls through the native path, as CUDA calls
F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}
NODES = (sj.BaseNode, our.Neuron)  # what the monitors watch


def kw(kind: types.ModuleType, backend: str) -> dict:
    return {} if kind is sj else {"backend": backend}


def weighted(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.linspace(0.1, 1.0, y.numel(), dtype=y.dtype).view_as(y)).sum()


def run(net: nn.Module, x: torch.Tensor, step_mode: str) -> torch.Tensor:
    return net(x) if step_mode == "m" else torch.stack([net(t) for t in x])


def flat(record: object) -> list[torch.Tensor]:
    """A monitor's record as a list of tensors (a number as a tensor, None as an empty one)."""
    if isinstance(record, torch.Tensor):
        return [record.detach()]
    if isinstance(record, (tuple, list)):
        return [t for r in record for t in flat(r)]
    return [torch.empty(0, dtype=F64) if record is None else torch.tensor(float(record), dtype=F64)]


def assert_same(theirs: list[torch.Tensor], mine: list[torch.Tensor]) -> None:
    assert len(theirs) == len(mine)
    for i, (a, b) in enumerate(zip(theirs, mine)):
        assert a.shape == b.shape, i
        torch.testing.assert_close(b.to(a.dtype), a, **TOL, msg=lambda m, i=i: f"item {i}: {m}")


# -- a convolutional network trained over several sequences, with SpikingJelly's monitors on the neurons -------
def conv_net(kind: types.ModuleType, step_mode: str, backend: str) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        layer.Conv2d(2, 4, 3, padding=1, step_mode=step_mode),
        layer.BatchNorm2d(4, step_mode=step_mode),
        kind.LIFNode(tau=2.0, surrogate_function=sg.ATan(), detach_reset=True, step_mode=step_mode,
                     **kw(kind, backend)),
        layer.MaxPool2d(2, step_mode=step_mode),
        layer.Flatten(step_mode=step_mode),
        layer.Linear(16, 6, step_mode=step_mode),
        kind.IFNode(v_threshold=0.3, store_v_seq=True, step_mode=step_mode, **kw(kind, backend)),
        layer.Linear(6, 3, step_mode=step_mode),
        kind.ParametricLIFNode(v_threshold=0.2, v_reset=None, step_mode=step_mode, **kw(kind, backend)),
    ).to(F64)


def train_with_monitors(net: nn.Sequential, step_mode: str) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Two sequences of two chunks each: SGD steps, detach_net between chunks, reset_net between sequences. The
    outputs, v_seq, the weights after each step and every monitor's records."""
    mons = [monitor.OutputMonitor(net, NODES), monitor.InputMonitor(net, NODES),
            monitor.AttributeMonitor("v", False, net, NODES), monitor.AttributeMonitor("v", True, net, NODES),
            monitor.GradInputMonitor(net, NODES), monitor.GradOutputMonitor(net, NODES),
            monitor.AttributeMonitor("v_seq", False, net, NODES, lambda v: None if v is None else v.clone())]
    got = []
    torch.manual_seed(1)
    for _ in range(2):
        x = 3 * torch.rand(4, 2, 2, 4, 4, dtype=F64)
        for chunk in x.split(2):
            y = run(net, chunk, step_mode)
            net.zero_grad()
            weighted(y).backward()
            with torch.no_grad():  # an SGD step (torch.optim's first optimiser costs seconds of imports)
                for p in net.parameters():
                    p -= 0.05 * p.grad
            got += [y.detach(), net[6].v_seq, *(p.detach().clone() for p in net.parameters())]
            F.detach_net(net)
            assert not net[6].v.requires_grad
        F.reset_net(net)
        assert all(float(m.v) == 0.0 for m in (net[2], net[6], net[8]))
    records = [[t for r in m.records for t in flat(r)] for m in mons]
    for m in mons:
        m.close()
    return got, records


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_training_and_monitors_as_theirs(step_mode: str, backend: str) -> None:
    (theirs, their_records), (mine, my_records) = (train_with_monitors(conv_net(kind, step_mode, backend), step_mode)
                                                   for kind in (sj, our))
    assert sum(float(t.sum()) for t in theirs[::8]) > 0  # the last layer fires: the gradients reach every layer
    assert_same(theirs, mine)
    for a, b in zip(their_records, my_records):
        assert_same(a, b)


# -- containers ---------------------------------------------------------------------------------------------------
def container_net(kind: types.ModuleType, backend: str) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        layer.SeqToANNContainer(nn.Linear(6, 5), nn.BatchNorm1d(5)),
        layer.MultiStepContainer(kind.LIFNode(**kw(kind, backend))),
        layer.StepModeContainer(True, "m", kind.IzhikevichNode(**kw(kind, backend))),
        layer.StepModeContainer(False, "m", nn.Linear(5, 4)),
        layer.TLastMultiStepContainer(nn.Identity()),
        kind.QIFNode(step_mode="m", **kw(kind, backend)),
    ).to(F64)


def recurrent_net(kind: types.ModuleType, step_mode: str, backend: str) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        layer.Linear(6, 5, step_mode=step_mode),
        layer.ElementWiseRecurrentContainer(kind.LIFNode(**kw(kind, backend)), lambda y, x: 0.5 * y + x,
                                            step_mode=step_mode),
        layer.LinearRecurrentContainer(kind.EIFNode(**kw(kind, backend)), 5, 5, step_mode=step_mode),
        layer.Linear(5, 3, step_mode=step_mode),
        kind.ParametricLIFNode(step_mode=step_mode, **kw(kind, backend)),
    ).to(F64)


def train(net: nn.Module, step_mode: str, chunks: int) -> list[torch.Tensor]:
    """Two sequences (detach_net between `chunks` chunks, reset_net after each): outputs, gradients, memories."""
    got = []
    torch.manual_seed(1)
    for _ in range(2):
        for chunk in (2 * torch.rand(6, 3, 6, dtype=F64)).split(6 // chunks):
            y = run(net, chunk, step_mode)
            net.zero_grad()
            weighted(y).backward()
            got += [y.detach(), *(p.grad.clone() for p in net.parameters())]
            got += [torch.as_tensor(m).detach().clone() for m in base.extract_memories(net)]
            if chunks > 1:
                F.detach_net(net)
        F.reset_net(net)
    return got


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("build", "step_mode", "chunks"), [
    (lambda kind, _, backend: container_net(kind, backend), "m", 2),
    # SpikingJelly's recurrent containers keep a view as their memory, which their detach() refuses: one chunk
    (recurrent_net, "m", 1), (recurrent_net, "s", 1)], ids=["containers", "recurrent-m", "recurrent-s"])
def test_containers_as_theirs(build, step_mode: str, chunks: int, backend: str) -> None:
    theirs, mine = (train(build(kind, step_mode, backend), step_mode, chunks) for kind in (sj, our))
    assert sum(float(t.abs().sum()) for t in theirs) > 0
    assert_same(theirs, mine)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_functional_forwards_and_losses_as_theirs(backend: str) -> None:
    def outcome(kind: types.ModuleType) -> list[torch.Tensor]:
        torch.manual_seed(2)
        single = kind.LIFNode(**kw(kind, backend)).to(F64)
        izh = kind.IzhikevichNode(**kw(kind, backend)).to(F64)
        net = nn.Sequential(layer.Linear(6, 5, step_mode="m"), kind.IFNode(step_mode="m", **kw(kind, backend)),
                            layer.Linear(5, 3, step_mode="m"), kind.LIFNode(step_mode="m", **kw(kind, backend)))
        net = net.to(F64)
        x = (3 * torch.rand(5, 2, 6, dtype=F64)).requires_grad_()
        y = F.multi_step_forward(x, [nn.Identity(), single])
        flat_y = F.seq_to_ann_forward(y, nn.Flatten())
        t_last = F.t_last_multi_step_forward(x.permute(1, 2, 0), izh)  # non-contiguous steps
        loss = F.spike_similar_loss(y.permute(1, 2, 0), torch.eye(2), "linear", "mse")
        (loss + weighted(flat_y) + weighted(t_last)).backward()
        with torch.no_grad():
            chunked = F.chunk_multi_step_forward(2, x.detach(), net)
        return [y, t_last, F.first_spike_index(y.permute(1, 2, 0)).to(F64), loss, x.grad, chunked, single.v, izh.v,
                izh.w, *base.extract_memories(net)]

    assert_same(outcome(sj), outcome(our))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("chunks", [1, 2])
def test_memopt_checkpoint_module_as_theirs(chunks: int, backend: str) -> None:
    """SpikingJelly's activation checkpointing runs our layers from explicit states (`to_functional_forward`)."""
    def outcome(kind: types.ModuleType, wrap: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = nn.Sequential(layer.Linear(6, 5, step_mode="m"), kind.LIFNode(step_mode="m", **kw(kind, backend)),
                            layer.Linear(5, 4, step_mode="m"),
                            kind.IzhikevichNode(step_mode="m", **kw(kind, backend))).to(F64)
        call = memopt.checkpoint_module(net, chunks=chunks) if wrap else net
        got = []
        torch.manual_seed(1)
        for _ in range(2):
            x = (3 * torch.rand(6, 3, 6, dtype=F64)).requires_grad_()
            y = call(x)
            net.zero_grad()
            weighted(y).backward()
            got += [y.detach(), x.grad, *(p.grad for p in net.parameters()), *base.extract_memories(net)]
            F.reset_net(net)
        return got

    theirs = outcome(sj, True)
    assert_same(theirs, outcome(our, True))
    assert_same(theirs, outcome(our, False))


def test_state_dicts_and_copies_as_theirs() -> None:
    def net(kind: types.ModuleType) -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(layer.Linear(6, 5), kind.ParametricLIFNode(surrogate_function=sg.Erf(), store_v_seq=True),
                             layer.Linear(5, 4), kind.LIFNode(store_v_seq=True)).to(F64)

    theirs, mine = net(sj), net(our)
    mine.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(mine.state_dict())
    x = 3 * torch.rand(4, 2, 6, dtype=F64)
    with torch.no_grad():  # (SpikingJelly's nodes cannot be deep-copied with a graph on their states)
        for step in x[:2]:
            for n in (theirs, mine):
                n(step)
    copies = [copy.deepcopy(n) for n in (theirs, mine)]
    for a, b in ((theirs, mine), tuple(copies)):
        assert_same([a(t) for t in x[2:]] + [a[3].v_seq], [b(t) for t in x[2:]] + [b[3].v_seq])


# -- faults found here ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["LIFNode", "IzhikevichNode", "ParametricLIFNode", "CUBALIFNode", "TernaryIFNode",
                                  "ActivationAwareIFNode"])
def test_a_step_mode_of_another_value_is_refused_at_once_as_theirs(name: str) -> None:
    """It was taken (`node.step_mode = 'x'`, `set_step_mode(net, 'x')`) and refused only at the next call."""
    for kind in (sj, our):
        node = getattr(kind, name)()
        with pytest.raises(ValueError, match="step_mode"):
            F.set_step_mode(nn.Sequential(node), "x")
        with pytest.raises(ValueError, match="step_mode"):
            node.step_mode = None
        assert node.step_mode == "s"
        F.set_step_mode(nn.Sequential(node), "m")
        assert node.step_mode == "m"


def psn_net(kind: types.ModuleType, tail: str) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [layer.Conv2d(2, 3, 3, padding=1, step_mode="m"), layer.BatchNorm2d(3, step_mode="m"),
              kind.LIFNode(step_mode="m"), layer.Flatten(step_mode="m"), layer.Linear(48, 4, step_mode="m")]
    if tail == "PSN":
        blocks.append(kind.PSN(T=4))
    elif kind is our:  # BatchNormNeuron: ours only
        blocks += [our.BatchNormNeuron(4, our.IFNode(step_mode="m"), dims=1)]
    return nn.Sequential(*blocks).to(F64)


@pytest.mark.parametrize("tail", ["PSN", "BatchNormNeuron"])
@pytest.mark.parametrize("transform", [fuse_conv_bn_eval_modules, pack_conv_bn_train_modules])
def test_spikingjellys_conv_bn_transforms_keep_our_step_modules_whole(transform, tail: str) -> None:
    """SpikingJelly's fx tracer keeps its `base.StepModule`s whole; our PSN and BatchNormNeuron were none, so the
    transforms traced into them and failed (our layers refuse an fx trace)."""
    for kind in (sj, our):
        net = psn_net(kind, tail).train(transform is pack_conv_bn_train_modules)
        x = 3 * torch.rand(4, 2, 2, 4, 4, dtype=F64)
        expected = net(x)
        F.reset_net(net)
        torch.testing.assert_close(transform(net)(x), expected, **TOL)


def multi_step_only() -> list[nn.Module]:
    class Charge(our.NonSpikingBaseNode):
        def neuronal_charge(self, x: torch.Tensor) -> None:
            self.v = self.v + x

    return [our.PSN(T=4), our.NonSpikingIFNode(), our.NonSpikingLIFNode(), our.DSRIFNode(T=4), Charge(),
            our.NoisyCUBALIFNode(T=4, num_node=3), our.ILCIFNode(act_dim=2, dec_pop_dim=2)]


@pytest.mark.parametrize("layer_", multi_step_only(), ids=lambda m: type(m).__name__)
def test_multi_step_only_layers_are_their_multi_step_modules(layer_: nn.Module) -> None:
    """As SpikingJelly's classes: `base.MultiStepModule`s whose `supported_step_mode()` is ('m',) (it said ('s', 'm'),
    where the setter refused 's'); NonSpikingBaseNode took any step_mode without a word."""
    assert isinstance(layer_, base.MultiStepModule) and layer_.supported_step_mode() == ("m",)
    with pytest.raises(ValueError, match="step_mode"):
        F.set_step_mode(nn.Sequential(layer_), "s")
    assert layer_.step_mode == "m"


@pytest.mark.parametrize("name", ["OTTTLIFNode", "SLTTLIFNode"])
def test_online_nodes_say_they_support_single_steps_only(name: str) -> None:
    node = getattr(our, name)()
    assert node.supported_step_mode() == ("s",)
    with pytest.raises(ValueError, match="step_mode"):
        node.step_mode = "m"


# -- wider sweeps ----------------------------------------------------------------------------------------------------
SWEEP = ["IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "CUBALIFNode", "KLIFNode",
         "RAFNode"]


@pytest.mark.skipif(profile() != "slow", reason="every class in SpikingJelly's containers and monitors: --slow")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", SWEEP)
def test_every_class_in_containers_and_monitors_as_theirs(name: str, backend: str) -> None:
    def outcome(kind: types.ModuleType) -> list[torch.Tensor]:
        torch.manual_seed(0)
        last = getattr(kind, name)(**kw(kind, backend))  # (CUBALIFNode takes no step_mode, as SpikingJelly's)
        last.step_mode = "m"
        net = nn.Sequential(layer.SeqToANNContainer(nn.Linear(6, 5)),
                            layer.MultiStepContainer(getattr(kind, name)(**kw(kind, backend))),
                            layer.Linear(5, 4, step_mode="m"), last).to(F64)
        mons = [monitor.OutputMonitor(net, NODES), monitor.AttributeMonitor("v", False, net, NODES)]
        if name != "RAFNode":  # its first step's spike has no graph (it reads the states only); the kernels' has one
            mons.append(monitor.GradOutputMonitor(net, NODES))
        got = train(net, "m", 2)
        got += [t for m in mons for r in m.records for t in flat(r)]
        for m in mons:
            m.close()
        return got

    assert_same(outcome(sj), outcome(our))
