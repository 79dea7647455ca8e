"""Faults found probing FlexSN, the fused BatchNorm layer and its running statistics (CPU, float64), pinned:
BatchNormNeuron updates its running statistics as torch's BatchNorm does without `num_batches_tracked`, refuses a
double backward through its two-pass kernels with the kernels' own error, checks a `neuron` or `dims` set after
construction; FlexSN refuses setting `num_inputs`/`num_outputs`, takes a [T] sequence of one neuron as
SpikingJelly's FlexSN does, checks its input and reads its static inputs alike on every backend ('eager' too), and
a call reads no disk cache (torch.compile(fullgraph=True) traces it)."""
from __future__ import annotations

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from torch import nn

import autocuda.nn as ann
from autocuda.nn import FlexSN, flexsn
from autocuda.spec.surrogate import Sigmoid

DT = torch.float64
sg = Sigmoid()


def _input(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DT) * 2 + 0.5


# ---- BatchNormNeuron ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_statistics_without_num_batches_tracked_follow_torch(momentum: float | None) -> None:
    """torch's BatchNorm with num_batches_tracked set to None still updates its running statistics by momentum
    (momentum None: factor 0, unchanged); the fused layer left them as they were."""
    bn = nn.BatchNorm2d(4, momentum=momentum).double()
    fused = ann.BatchNormNeuron(4, "lif", momentum=momentum, step_mode="m", backend="reference").double()
    bn.num_batches_tracked = None
    fused.num_batches_tracked = None
    for seed in range(2):
        x = _input(3, 2, 4, 2, 2, seed=seed)
        bn(x.flatten(0, 1))
        fused(x)
        fused.reset()
    torch.testing.assert_close(fused.running_mean, bn.running_mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(fused.running_var, bn.running_var, rtol=1e-12, atol=1e-14)
    if momentum is not None:
        assert not torch.equal(fused.running_mean, torch.zeros(4, dtype=DT))


@NEEDS_HOST
def test_two_pass_training_call_refuses_a_double_backward_by_name() -> None:
    """The two-pass backward (multi-step training on the kernels) gave a first gradient without a graph, so a
    second derivative failed with torch's 'element 0 of tensors does not require grad'."""
    fused = ann.BatchNormNeuron(4, "lif", step_mode="m", backend="host").double()
    x = _input(3, 2, 4, 3, 3).requires_grad_()
    y = fused(x)
    grad, = torch.autograd.grad((y * torch.randn_like(y)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        grad.sum().backward()


def test_a_neuron_set_after_construction_is_checked() -> None:
    fused = ann.BatchNormNeuron(4, "lif", step_mode="m", backend="reference")
    with pytest.raises(TypeError, match="^neuron: expected an autocuda Neuron layer"):
        fused.neuron = nn.ReLU()
    fused.neuron = ann.IFNode(step_mode="m", backend="reference")  # another neuron layer: taken
    assert isinstance(fused.neuron, ann.IFNode)


def test_dims_set_after_construction_is_checked_at_the_call() -> None:
    fused = ann.BatchNormNeuron(4, "lif", step_mode="m", backend="reference").double()
    fused.dims = 7
    with pytest.raises(ValueError, match="^dims: expected 1, 2 or 3"):
        fused(_input(3, 2, 4, 3, 3))
    fused.dims = 1  # read at each call: now BatchNorm1d's shapes
    assert fused(_input(3, 2, 4, 5)).shape == (3, 2, 4, 5)


# ---- FlexSN ------------------------------------------------------------------------------------------------
def multi_core(x, v, w, tau):  # two states, two outputs (the spike and the charge, read after the kernel)
    h = v + (x - v - w) / tau
    s = sg(h - 1.0)
    return s, h, h * (1.0 - s), 0.5 * w + 0.2 * s


def test_num_inputs_and_num_outputs_are_fixed_at_construction() -> None:
    layer = FlexSN(multi_core, 2, (torch.tensor(2.0, dtype=DT),))
    assert (layer.num_inputs, layer.num_outputs) == (1, 2)
    with pytest.raises(AttributeError, match="num_inputs is fixed at construction"):
        layer.num_inputs = 2
    with pytest.raises(AttributeError, match="num_outputs is fixed at construction"):
        layer.num_outputs = 1
    assert (layer.num_inputs, layer.num_outputs) == (1, 2)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_sequence_of_one_neuron_runs_as_the_core_steps(backend: str) -> None:
    """[T] in step mode 'm' (one neuron; SpikingJelly's FlexSN takes it, as single steps take a 0-d input) was
    refused by the kernels' path; outputs, states and sequences keep the core's shapes, gradients flow."""
    tau = torch.tensor(2.0, dtype=DT)
    layer = FlexSN(multi_core, 2, (nn.Parameter(tau.clone()),), store_state_seqs=True, backend=backend)
    twin = FlexSN(multi_core, 2, (nn.Parameter(tau.clone()),), store_state_seqs=True, backend="eager")
    x = _input(6).requires_grad_()
    ours = layer(x[:3]) + layer(x[3:])  # the states carry across the calls
    theirs = twin(x[:3]) + twin(x[3:])
    for a, b in zip(ours, theirs):
        assert a.shape == (3,)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert [s.shape for s in layer.states] == [torch.Size([])] * 2
    assert [q.shape for q in layer.state_seqs] == [torch.Size([3])] * 2
    weights = torch.linspace(0.5, 1.5, 3, dtype=DT)
    loss = [sum((o * weights).sum() for o in out) + sum(s.sum() for s in m.states)
            for out, m in ((ours, layer), (theirs, twin))]
    grads = [torch.autograd.grad(total, (x, *m.parameters())) for total, m in zip(loss, (layer, twin))]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_eager_backend_checks_its_input_and_reads_static_inputs_as_the_kernels_do() -> None:
    """'eager' indexed an empty or 0-d sequence (IndexError), and passed a per-neuron static input unshaped to the
    core, where the other backends refuse or reshape it."""
    layer = FlexSN(multi_core, 2, (torch.linspace(1.5, 3.0, 12, dtype=DT),), backend="eager")
    for bad in (torch.zeros(0, 3, 4, dtype=DT), torch.tensor(1.0, dtype=DT)):
        with pytest.raises(ValueError, match="step_mode 'm' expects"):
            layer(bad)
    x = _input(4, 3, 4)
    reference = FlexSN(multi_core, 2, (torch.linspace(1.5, 3.0, 12, dtype=DT),), backend="reference")
    for a, b in zip(layer(x), reference(x)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    wrong = FlexSN(multi_core, 2, (torch.ones(6, dtype=DT),), backend="eager")
    with pytest.raises(ValueError, match="static input 'tau': 6 values"):
        wrong(_input(4, 2, 6))


def test_a_call_reads_no_disk_cache_so_torch_compile_traces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output the core computes beside the spike (here h) had its program read from the disk cache inside the
    call: torch.compile(fullgraph=True) failed there, on the file system call (posix.lstat). Its programs are made
    with the layer now; a call (a fresh process's first) touches no cache."""
    layer = FlexSN(multi_core, 2, (torch.tensor(2.0, dtype=DT),), backend="reference")
    flexsn._output_program.cache_clear()  # as in a process whose first call this is

    def refuse(*args: object) -> None:
        raise AssertionError("the call read the disk cache")

    monkeypatch.setattr(flexsn.store, "read", refuse)
    monkeypatch.setattr(flexsn.store, "save", refuse)
    spike, h = layer(_input(4, 6))
    assert h.shape == (4, 6)
