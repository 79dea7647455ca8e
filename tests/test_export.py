"""torch.export of networks with autocuda layers (the host runner: the kernels' CPU path), strict and non-strict:
the exported program gives eager's outputs and, through `ep.module()`, eager's gradients; dynamic T and batch,
`run_decompositions`, `torch.export.save`/`load` (in this process and in a fresh one, which runs the model once first:
docs/quickstart.md, Exporting), the program's start from the states held at export, and `torch.compile` of the
unlifted module. Refused by name: a step that draws random numbers (one seed per call). Faults found here: a drawing
step recursed without end (non-strict) or named only a disabled function (strict); a training BatchNormNeuron lost its
gradient under a strict export (its autograd Functions, whose backward torch.export drops); a program exported where
nothing needed a gradient failed training with a bare message."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from conftest import profile
from torch.export import Dim

from autocuda import nn as ann

F64 = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore:The tensor attribute", "ignore:While compiling, we found certain",
                                        "ignore:.*LeafSpec.*:FutureWarning")  # torch's own, in export.save
STRICT = [pytest.param(False, id="non-strict"), pytest.param(True, id="strict")]


def inputs(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator, dtype=F64) * 2.5 - 0.5


def network(step_mode: str = "m", backend: str = "host") -> torch.nn.Sequential:
    """Linear -> ParametricLIF (a learnable parameter) -> Linear -> LIF, float64; every layer spikes on `inputs`."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), ann.ParametricLIFNode(step_mode=step_mode, backend=backend),
                              torch.nn.Linear(4, 4), ann.LIFNode(step_mode=step_mode, backend=backend, tau=1.5))
    with torch.no_grad():  # weights that make every neuron layer spike, some neurons more than others
        net[0].weight.copy_(torch.linspace(-0.5, 1.5, 12).view(4, 3))
        net[2].weight.copy_(torch.linspace(-0.2, 1.2, 16).view(4, 4))
        net[0].bias.fill_(0.3)
        net[2].bias.fill_(0.1)
    return net.to(F64)


def reset(net: torch.nn.Module) -> None:
    for m in net.modules():
        if hasattr(m, "reset") and m is not net:
            m.reset()


def eager_and_program(net: torch.nn.Module, program: torch.nn.Module, *x: torch.Tensor
                      ) -> tuple[tuple[torch.Tensor, dict], tuple[torch.Tensor, dict]]:
    """(output, gradients by name: x's and the parameters') of `net` from reset states, then of `program` (which
    shares net's parameters)."""
    results = []
    for module in (net, program):
        reset(net)
        net.zero_grad()
        program.zero_grad()
        given = [u.clone().requires_grad_() for u in x]
        out = module(*given)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        (out * weights).sum().backward()
        grads = {f"x{i}": u.grad for i, u in enumerate(given)}
        grads |= {n.removeprefix("_orig_mod."): p.grad for n, p in module.named_parameters()}
        results.append((out.detach(), grads))
    return results[0], results[1]


def assert_same(eager: tuple[torch.Tensor, dict], exported: tuple[torch.Tensor, dict]) -> None:
    assert eager[0].abs().sum() > 0
    assert torch.equal(eager[0], exported[0])
    assert eager[1].keys() == exported[1].keys()
    for name, grad in eager[1].items():
        assert grad is not None and exported[1][name] is not None, name
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(exported[1][name], grad, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_a_network_exports_with_its_outputs_and_gradients(strict, step_mode):
    """Linear and neuron layers (one with a learnable parameter), multi-step and single step: the program's outputs
    are eager's bit for bit, its gradients (x's, the Linears', PLIF's w) eager's."""
    net = network(step_mode)
    x = (inputs(5, 2, 3) if step_mode == "m" else inputs(2, 3)) * 3
    exported = torch.export.export(net, (x.clone().requires_grad_(),), strict=strict)
    assert any("autocuda.neuron_forward" in str(n.target) for n in exported.graph.nodes)
    other = (inputs(5, 2, 3, seed=3) if step_mode == "m" else inputs(2, 3, seed=3)) * 3
    assert_same(*eager_and_program(net, exported.module(), other))


@pytest.mark.parametrize("strict", STRICT)
def test_a_neuron_of_two_step_inputs_exports(strict):
    """conductance_lif takes g_e and g_i: both are the op's inputs, each gets eager's gradient."""
    layer = ann.Neuron("conductance_lif", step_mode="m", backend="host").to(F64)
    x = (inputs(5, 2, 3).requires_grad_(), inputs(5, 2, 3, seed=2).requires_grad_())
    exported = torch.export.export(layer, x, strict=strict)
    eager, program = eager_and_program(layer, exported.module(), inputs(5, 2, 3, seed=1), inputs(5, 2, 3, seed=3))
    assert_same(eager, program)


def test_dynamic_time_and_batch_with_decompositions_and_a_saved_copy(tmp_path):
    """One export told that T and the batch vary: the program, its run_decompositions() (the op stays one op) and its
    saved and loaded copy give eager's outputs and gradients at other sizes."""
    net = network()
    dims = {0: Dim("T", min=2, max=64), 1: Dim("B", min=2, max=64)}
    exported = torch.export.export(net, (inputs(5, 2, 3).requires_grad_(),), dynamic_shapes=(dims,))
    decomposed = exported.run_decompositions()
    assert [str(n.target) for n in decomposed.graph.nodes if "autocuda" in str(n.target)] == \
        ["autocuda.neuron_forward.default"] * 2
    torch.export.save(exported, tmp_path / "net.pt2")
    loaded = torch.export.load(tmp_path / "net.pt2")
    for program in (exported, decomposed, loaded):
        module = program.module()
        if program is loaded:  # a loaded program holds its own parameters: eager's are loaded into it
            module.load_state_dict(net.state_dict())
        for shape in ((9, 4, 3), (2, 2, 3)):
            eager, ran = eager_and_program(net, module, inputs(*shape, seed=3) * 3)
            if program is loaded:  # its parameters are not net's: compare x's gradient and the output
                eager = (eager[0], {"x0": eager[1]["x0"]})
                ran = (ran[0], {"x0": ran[1]["x0"]})
            assert_same(eager, ran)


LOAD = """
import sys, warnings, torch
warnings.simplefilter("ignore")
sys.path.insert(0, {tests!r})
import test_export as t
net = t.network()
net.load_state_dict(torch.load({weights!r}))
x = t.inputs(6, 3, 3, seed=4) * 3
net(x)  # the process runs the model once: its configurations' keys are known (docs/quickstart.md)
t.reset(net)
expected = net(x)
program = torch.export.load({path!r}).module()
print(torch.equal(program(x), expected), float(expected.abs().sum()) > 0)
"""


@pytest.mark.skipif(profile() != "slow", reason="a fresh process importing torch (6 s): --slow")
def test_a_saved_program_runs_in_a_fresh_process(tmp_path):
    """The op key is the same in every process: a new process that runs the model once runs the saved program."""
    net = network()
    dims = {0: Dim("T", min=2, max=64), 1: Dim("B", min=2, max=64)}
    torch.export.save(torch.export.export(net, (inputs(5, 2, 3) * 3,), dynamic_shapes=(dims,)), tmp_path / "n.pt2")
    torch.save(net.state_dict(), tmp_path / "n.sd")
    code = LOAD.format(tests=str(__import__("pathlib").Path(__file__).parent), weights=str(tmp_path / "n.sd"),
                       path=str(tmp_path / "n.pt2"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("strict", STRICT)
def test_a_program_starts_from_the_states_held_at_export(strict):
    """Documented (docs/quickstart.md, Exporting): the program keeps no states from call to call; each call starts
    from the states the layer held when it was exported, and the layer's own states are left as they were."""
    layer = ann.LIFNode(step_mode="m", backend="host")
    layer(inputs(5, 2, 3, seed=7) * 2)
    held = layer.v.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = torch.export.export(layer, (inputs(5, 2, 3),), strict=strict).module()
    assert caught  # torch warns of the state set during export
    assert torch.equal(layer.v, held)
    x = inputs(5, 2, 3, seed=1) * 2
    first, second = program(x), program(x)
    layer.v = held.clone()
    expected = layer(x)
    assert expected.abs().sum() > 0
    assert torch.equal(first, expected) and torch.equal(second, expected)


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_a_step_that_draws_is_refused_by_name(strict, step_mode):
    """noisy_cuba_lif draws with a fresh seed each call, which a program would hold as one constant. The non-strict
    export recursed without end (RecursionError: the eager fallback torch.compile takes is no fallback there); the
    strict one named only a function wrapped by torch.compiler.disable."""
    layer = ann.Neuron("noisy_cuba_lif", step_mode=step_mode, backend="host").to(F64)
    x = inputs(5, 2, 3) if step_mode == "m" else inputs(2, 3)
    with pytest.raises(Exception, match=r"noisy_cuba_lif'?: its step draws random numbers .* cannot be exported") \
            as raised:
        torch.export.export(layer, (x,), strict=strict)
    assert not isinstance(raised.value, RecursionError)
    assert type(layer(x)) is torch.Tensor  # eager calls still run


class ConvBatchNormNeuron(torch.nn.Module):
    """Conv2d over [T*B, C, H, W], then BatchNormNeuron over [T, B, C, H, W]."""

    def __init__(self, store_v_seq: bool):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 2, 1).to(F64)
        self.bn = ann.BatchNormNeuron(2, step_mode="m", backend="host").to(F64)
        self.bn.neuron.store_v_seq = store_v_seq  # (a sequence kept: not the two-pass backward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x.flatten(0, 1)).unflatten(0, x.shape[:2]))


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("store_v_seq", [False, True], ids=["two passes", "one pass"])
def test_a_training_batchnorm_neuron_keeps_its_gradients_through_export(strict, store_v_seq):
    """torch.export keeps no autograd Function's backward. A strict export ran BatchNormNeuron's Functions without
    grad: the two-pass call's spikes had no gradient at all ('element 0 of tensors does not require grad'), and
    through the batch statistics' Function the Conv's gradients were off, silently."""
    model = ConvBatchNormNeuron(store_v_seq)
    x = inputs(4, 3, 2, 3, 3) * 2
    exported = torch.export.export(model, (x.clone().requires_grad_(),), strict=strict)
    program = exported.module()
    running = model.bn.running_mean.clone()
    eager, ran = eager_and_program(model, program, x)
    assert_same(eager, ran)
    assert not torch.equal(model.bn.running_mean, running)  # eager training updated them (the program's are its own)


def test_training_a_program_exported_without_gradients_says_how():
    """An export where nothing needs a gradient records the kernels without what backward reads; training through
    it raised a bare 'ran with save_for_backward=False' that named no export."""
    layer = ann.LIFNode(step_mode="m", backend="host")
    program = torch.export.export(layer, (inputs(5, 2, 3),)).module()
    out = program(inputs(5, 2, 3, seed=1).requires_grad_())
    with pytest.raises(RuntimeError, match=r"save_for_backward=False.*torch\.export program, export it with grad"):
        out.sum().backward()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    profile() != "slow", reason="Inductor's C++ build of the graph: --slow"))])
def test_the_unlifted_module_compiles(backend):
    """torch.compile(fullgraph=True) of `ep.module()`: the ops in the graph, eager's outputs and gradients."""
    net = network()
    dims = {0: Dim("T", min=2, max=64), 1: Dim("B", min=2, max=64)}
    program = torch.export.export(net, (inputs(5, 2, 3).requires_grad_(),), dynamic_shapes=(dims,)).module()
    compiled = torch.compile(program, backend=backend, fullgraph=True)
    for shape in ((7, 3, 3), (4, 2, 3)):
        assert_same(*eager_and_program(net, compiled, inputs(*shape, seed=5) * 3))


@pytest.mark.skipif(profile() != "slow", reason="more layer classes: --slow")
@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("name", ["IFNode", "IzhikevichNode", "ALIFNode", "KLIFNode", "TernaryLIFNode",
                                  "ComplementaryLIFNode", "BatchNormNeuron eval"])
def test_more_layers_export(name, strict):
    make, shape, scale = {
        "IFNode": (lambda: ann.IFNode(step_mode="m", backend="host"), (5, 2, 3), 1.0),
        "IzhikevichNode": (lambda: ann.IzhikevichNode(step_mode="m", backend="host"), (5, 2, 3), 40.0),
        "ALIFNode": (lambda: ann.ALIFNode(step_mode="m", backend="host"), (5, 2, 3), 2.0),
        "KLIFNode": (lambda: ann.KLIFNode(step_mode="m", backend="host"), (5, 2, 3), 2.0),
        "TernaryLIFNode": (lambda: ann.TernaryLIFNode(step_mode="m", backend="host"), (5, 2, 3), 2.0),
        "ComplementaryLIFNode": (lambda: ann.ComplementaryLIFNode(step_mode="m", backend="host"), (5, 2, 3), 2.0),
        "BatchNormNeuron eval": (lambda: ann.BatchNormNeuron(2, step_mode="m", backend="host").eval(),
                                 (5, 2, 2, 3, 3), 2.0),
    }[name]
    torch.manual_seed(0)
    layer = make().to(F64)
    exported = torch.export.export(layer, ((inputs(*shape) * scale).requires_grad_(),), strict=strict)
    eager, ran = eager_and_program(layer, exported.module(), inputs(*shape, seed=1) * scale)
    assert eager[0].abs().sum() > 0 and torch.equal(eager[0], ran[0])
    for key, grad in eager[1].items():
        torch.testing.assert_close(ran[1][key], grad, rtol=0, atol=1e-12, msg=key)
