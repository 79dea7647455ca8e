"""Sequences of calls on one stateful layer against SpikingJelly 2.0's same class (its torch path), in float64: calls
in both step modes, with and without gradients, under no_grad and inference_mode, inputs transposed or sliced,
requiring grad or not; the step mode switched, the batch or neuron shape changed without a reset, float64 then
float32 inputs, resets, states detached (`detach_net`, `layer.v = layer.v.detach()`), `store_v_seq` toggled, the
threshold, tau or a learned parameter changed between calls, and the layer called twice in one graph before one
backward. After every call the outputs and the states (v, the others, v_seq) agree, and after every backward the
gradients of the inputs and of the learned parameters: the fast paths that a layer keeps from its previous calls
(`nn.layer_call.run_keyed`, its programs per input class, the native plans) must not change what it computes. Each
sequence is drawn from a fixed seed. Documented differences (docs/spikingjelly.md) are left out where noted."""
from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from conftest import profile

import autocuda.nn as ours

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import functional as sj_functional
    from spikingjelly.activation_based import neuron as sj
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64

# class -> constructor arguments (SpikingJelly asserts floats)
CLASSES: dict[str, dict[str, Any]] = {
    "LIFNode": {"tau": 2.0}, "IFNode": {}, "ParametricLIFNode": {"init_tau": 2.0}, "IzhikevichNode": {},
    "QIFNode": {}, "EIFNode": {}, "KLIFNode": {}, "RAFNode": {}, "TernaryIFNode": {}, "TernaryLIFNode": {},
    "ILIFNode": {}, "HalfThresholdIFNode": {}, "ActivationAwareIFNode": {}, "SimpleIFNode": {},
    "SimpleLIFNode": {"tau": 2.0, "decay_input": True},
}
DEFAULT_CLASSES = ("LIFNode", "ParametricLIFNode", "IzhikevichNode")
SOFT = ("LIFNode", "IFNode", "ParametricLIFNode", "KLIFNode", "SimpleIFNode")  # v_reset=None drawn for these
# Documented differences (docs/spikingjelly.md) left out: SpikingJelly's Simple nodes have no store_v_seq and
# broadcast a state over a new shape (and promote a float64 state with a float32 input: ours keep the input's dtype);
# HalfThresholdIFNode's start reads v_threshold at each reset (SpikingJelly's the first); ActivationAwareIFNode's
# threshold is a tensor buffer
SIMPLE = ("SimpleIFNode", "SimpleLIFNode")
FIXED_THRESHOLD = ("HalfThresholdIFNode", "ActivationAwareIFNode")
OPERATIONS = ("call",) * 6 + ("backward",) * 2 + ("reset", "detach", "mode", "store", "parameter", "shape", "dtype",
                                                  "twice")


def _layout(values: torch.Tensor, how: str) -> torch.Tensor:
    """A new tensor of `values` laid out as `how` says: contiguous, transposed (the last two dims' strides swapped) or
    every other element of a wider tensor (a slice)."""
    if how == "transposed" and values.dim() >= 2:
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "sliced":
        return torch.stack((values, values), dim=-1).flatten(-2)[..., ::2]
    return values.clone()


def _close(what: str, got: Any, want: Any, loose: bool, done: list[str]) -> None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        assert type(got) is type(want) and got == want, f"{what}: {got!r} against {want!r} after {done}"
        return
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {tuple(got.shape)} {got.dtype} against {tuple(want.shape)} {want.dtype} after {done}"
    tol = 1e-5 if loose or got.dtype != F64 else 1e-11
    torch.testing.assert_close(got.detach(), want.detach(), rtol=tol, atol=tol,
                               msg=lambda m: f"{what} after {done}: {m}")


def _run(name: str, seed: int, length: int, backend: str) -> None:
    """One sequence of `length` operations drawn from `seed`, on our layer of class `name` (on `backend`) and
    SpikingJelly's."""
    draw, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    kwargs = dict(CLASSES[name])
    if name in SOFT and draw.random() < 0.3:
        kwargs["v_reset"] = None
    if name != "ActivationAwareIFNode" and draw.random() < 0.3:
        kwargs["detach_reset"] = True
    mine, theirs = getattr(ours, name)(backend=backend, **kwargs).double(), getattr(sj, name)(**kwargs).double()
    mine.load_state_dict(theirs.state_dict())
    mine.step_mode = theirs.step_mode = draw.choice(["s", "m"])
    shape, dtype = draw.choice([(3, 4), (2, 3, 2)]), F64
    losses: list[tuple[torch.Tensor, torch.Tensor]] = []  # of calls since the last backward
    leaves: list[tuple[torch.Tensor, torch.Tensor]] = []
    # float32 arithmetic since the last reset (its rounding carried in the states) or since the last backward
    rounded = graph_rounded = False
    done = [f"{name}({kwargs}) step_mode={mine.step_mode}"]
    for _ in range(length):
        operation = draw.choice(OPERATIONS)
        done.append(operation)
        if operation in ("call", "twice"):  # twice: the layer twice in one graph (its weights shared over time)
            for _ in range(2 if operation == "twice" else 1):
                size = (draw.choice([1, 3]), *shape) if mine.step_mode == "m" else shape
                values = torch.rand(size, dtype=F64, generator=generator) * 3 - 0.5
                how = draw.choice(["plain", "plain", "transposed", "sliced"])
                grad, mode = draw.random() < 0.6, draw.choice(["grad"] * 7 + ["no_grad", "inference_mode"])
                done[-1] += f" {mine.step_mode}{list(size)} {how} grad={grad} {mode} {str(dtype)[6:]}"
                x_mine, x_theirs = (_layout(values.to(dtype), how).detach().requires_grad_(grad) for _ in range(2))
                rounded = graph_rounded = rounded or dtype != F64
                if grad:
                    leaves.append((x_mine, x_theirs))
                context = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
                           "inference_mode": torch.inference_mode}[mode]
                with context():
                    got, want = mine(x_mine), theirs(x_theirs)
                _close("output", got, want, rounded, done)
                for state, value in theirs.named_memories():
                    _close(state, getattr(mine, state), value, rounded, done)
                _close("v_seq", mine.v_seq, getattr(theirs, "v_seq", None), rounded, done)  # (Simple nodes: none)
                if got.requires_grad and want.requires_grad:  # (RAF's first spike does not depend on x in theirs)
                    weights = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).view(got.shape)
                    loss_mine = (got * weights).sum() + 0.3 * mine.v.sum()
                    loss_theirs = (want * weights).sum() + 0.3 * theirs.v.sum()
                    seq_mine, seq_theirs = mine.v_seq, getattr(theirs, "v_seq", None)
                    if isinstance(seq_mine, torch.Tensor) and seq_mine.requires_grad and seq_theirs.requires_grad:
                        seq_weights = torch.linspace(1, 2, seq_mine.numel(), dtype=seq_mine.dtype)
                        loss_mine = loss_mine + (seq_mine * seq_weights.view(seq_mine.shape)).sum()
                        loss_theirs = loss_theirs + (seq_theirs * seq_weights.view(seq_theirs.shape)).sum()
                    losses.append((loss_mine, loss_theirs))
        elif operation == "backward" and losses:
            sum(loss for loss, _ in losses).backward()
            sum(loss for _, loss in losses).backward()
            for i, (a, b) in enumerate(leaves):
                _close(f"input {i}'s gradient", torch.zeros_like(a) if a.grad is None else a.grad,
                       torch.zeros_like(b) if b.grad is None else b.grad, graph_rounded, done)
            for (p_name, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters(), strict=True):
                _close(f"{p_name}'s gradient", torch.zeros_like(p) if p.grad is None else p.grad,
                       torch.zeros_like(q) if q.grad is None else q.grad, graph_rounded, done)
                p.grad = q.grad = None
            losses.clear(), leaves.clear()
            graph_rounded = False
            sj_functional.detach_net(mine), sj_functional.detach_net(theirs)  # the graphs were freed
        elif operation == "reset":
            mine.reset(), theirs.reset()
            losses.clear(), leaves.clear()
            rounded = graph_rounded = False
        elif operation == "detach":
            if draw.random() < 0.5:
                done[-1] += " detach_net"
                sj_functional.detach_net(mine), sj_functional.detach_net(theirs)
            else:
                done[-1] += " v = v.detach()"
                for layer in (mine, theirs):
                    if isinstance(layer.v, torch.Tensor):
                        layer.v = layer.v.detach()
        elif operation == "mode":
            mine.step_mode = theirs.step_mode = draw.choice(["s", "m"])
            done[-1] += f" {mine.step_mode}"
        elif operation == "store" and name not in SIMPLE:
            mine.store_v_seq = theirs.store_v_seq = draw.random() < 0.5
            done[-1] += f" {mine.store_v_seq}"
        elif operation == "parameter":
            if name == "LIFNode" and draw.random() < 0.5:
                mine.tau = theirs.tau = draw.choice([2.0, 3.0, 1.5])
                done[-1] += f" tau={mine.tau}"
            elif name == "ParametricLIFNode" and not losses:  # (changed under a graph, torch's rule holds: not here)
                value = draw.choice([0.3, -0.5])
                mine.w.data.fill_(value), theirs.w.data.fill_(value)
                done[-1] += f" w.data={value}"
            elif name not in FIXED_THRESHOLD:
                mine.v_threshold = theirs.v_threshold = draw.choice([1.0, 0.8, 1.2])
                done[-1] += f" v_threshold={mine.v_threshold}"
        elif operation == "shape" and name not in SIMPLE:
            shape = draw.choice([(3, 4), (2, 3, 2), (5,)])
            done[-1] += f" {shape}"
        elif operation == "dtype" and name not in SIMPLE:
            dtype = draw.choice([F64, F64, torch.float32])
            done[-1] += f" {dtype}"


@pytest.mark.parametrize("backend", ["host", pytest.param("native", marks=NEEDS_HOST)])
@pytest.mark.parametrize("name", DEFAULT_CLASSES)
def test_random_call_sequences_compute_what_spikingjelly_does(name: str, backend: str, request) -> None:
    """Host calls by the Python launch path (host programs' default) and by the native plans (CUDA calls' default)."""
    if backend == "native":
        request.getfixturevalue("native_on_host")
    for seed in range(2):
        _run(name, seed, 30, "host")


@pytest.mark.skipif(profile() != "slow", reason="every class, more and longer sequences: --slow")
@pytest.mark.parametrize("backend", ["host", "native", "reference"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_more_call_sequences_compute_what_spikingjelly_does(name: str, backend: str, request) -> None:
    if backend == "native":
        request.getfixturevalue("native_on_host")
    for seed in range(20):
        _run(name, seed, 40, "reference" if backend == "reference" else "host")


# -- faults found by the sequences -----------------------------------------------------------------------------
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("backend", [*CPU_BACKENDS, pytest.param("native", marks=NEEDS_HOST)])
@pytest.mark.parametrize("name", ["ParametricLIFNode", "IzhikevichNode"])
def test_training_goes_on_from_states_kept_under_inference_mode(name: str, backend: str, step_mode: str,
                                                                request) -> None:
    """Calls under torch.inference_mode leave inference tensors as states; a training call after them without a
    reset goes on from them, as SpikingJelly's does. The kernels' backward saves the initial states where it needs
    them (a learned parameter's gradient, a second state), and autograd saves no inference tensor: the call failed
    with 'Inference tensors cannot be saved for backward', on the full path (`layer_call.start_states`) and on the
    keyed one of the native plans (`layer_call.run_keyed`)."""
    if backend == "native":
        request.getfixturevalue("native_on_host")
        backend = "host"
    torch.manual_seed(0)
    size = (2, 3, 4) if step_mode == "m" else (3, 4)
    xs = [torch.rand(size, dtype=F64) * 3 - 0.5 for _ in range(4)]
    found = []
    for layer in (getattr(ours, name)(step_mode=step_mode, backend=backend).double(),
                  getattr(sj, name)(step_mode=step_mode).double()):
        for _ in range(3):  # the layer keeps its configuration and programs, tensor states' included
            layer.reset()
            layer(xs[0])
            x = xs[1].clone().requires_grad_()
            layer(x).sum().backward()
            layer.detach()
        layer.reset()
        with torch.inference_mode():
            layer(xs[2])
            layer(xs[2])
        x = xs[3].clone().requires_grad_()
        out = layer(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=F64).view(out.shape) + layer.v.sum()).sum().backward()
        found.append([out.detach(), layer.v.detach(), x.grad, *(p.grad for p in layer.parameters())])
        layer.detach()
    for got, want in zip(*found, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)
