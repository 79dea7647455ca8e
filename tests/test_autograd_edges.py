"""Torch's autograd rules at the kernels' calls, as for ordinary ops, on the host runner's Python path and on the
native path (its C++ autograd node, `native_on_host`), checked against the torch reference in float64: in-place
changes of what backward reads raise torch's error, a graph is run once without retain_graph, and a layer's calls
save tensors of one shape on whichever path runs them (torch.utils.checkpoint's recomputation compares them)."""
from __future__ import annotations

import os
import textwrap

import pytest
import python_children
import torch
import torch.utils.checkpoint

from autocuda import nn as ann
from autocuda.call import functional as F

MODIFIED = "modified by an inplace operation"


def layer_of(kind: str, step_mode: str, backend: str = "cupy") -> torch.nn.Module:
    if kind == "plif":
        return ann.ParametricLIFNode(step_mode=step_mode, backend=backend).double()
    return ann.Neuron("izhikevich", step_mode=step_mode, backend=backend).double()


def inputs(kind: str) -> torch.Tensor:
    """[T, 2, 8]: a neuron shape of two dims, whose states a layer's keyed call takes as they are, not as rows."""
    x = torch.rand(4, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2
    return x * 10 if kind == "izh" else x


def run_layer(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's spikes over x's steps from its initial states, in its step mode."""
    layer.reset()
    if layer.step_mode == "m":
        return layer(x)
    return torch.stack([layer(step) for step in x])


def gradients(layer: torch.nn.Module, x: torch.Tensor, checkpointed: bool) -> list[torch.Tensor]:
    """x's and the parameters' gradients of a loss that weighs each step differently, the layer (reset first)
    inside torch.utils.checkpoint (use_reentrant=False) where `checkpointed`."""
    x = x.clone().requires_grad_()
    for p in layer.parameters():
        p.grad = None
    if checkpointed:
        spikes = torch.utils.checkpoint.checkpoint(run_layer, layer, x, use_reentrant=False)
    else:
        spikes = run_layer(layer, x)
    weights = torch.arange(1, x.shape[0] + 1, dtype=x.dtype).view(-1, 1, 1)
    (spikes * weights).sum().backward()
    return [x.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.usefixtures("native_on_host")
@pytest.mark.parametrize("kind, step_mode", [("plif", "m"), ("plif", "s"), ("izh", "s")])
def test_a_checkpointed_layer_recomputes_through_its_native_plan(kind, step_mode):
    """A layer reset inside torch.utils.checkpoint, trained over several iterations: the call that makes the native
    plan runs the full path, its recomputation the keyed one (`nn.layer_call.run_keyed`); both save the states in x's
    neuron shape and a learnable parameter of one value in its own, so the checkpoint takes the recomputation (it
    raised CheckpointError: saved [16] against recomputed [2, 8], [1] against []) and the gradients are those of the
    same calls without the checkpoint."""
    x = inputs(kind)
    plain, checkpointed = layer_of(kind, step_mode), layer_of(kind, step_mode)
    for _ in range(4):  # the plan is made at the call after the first backward; then the keyed path runs
        want = gradients(plain, x, False)
        got = gradients(checkpointed, x, True)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


@pytest.mark.usefixtures("native_library")
def test_a_second_backward_through_the_native_node_raises_torchs_error():
    """Backward twice through a native call's graph without retain_graph: torch's 'backward through the graph a
    second time' RuntimeError, as the Python path raises, not a crash (run in a child: it crashed)."""
    script = textwrap.dedent("""
        import torch
        from autocuda.call import functional as F
        for _ in range(3):  # a training program's native plan is made at its call after the first backward
            x = torch.rand(4, 8, dtype=torch.float64, requires_grad=True)
            spikes = F.multi_step("lif", x, backend="host", tau=2.0)[0]
            spikes.sum().backward()
        assert type(spikes.grad_fn).__name__ == "CppFunction", spikes.grad_fn
        try:
            spikes.sum().backward()
        except RuntimeError as error:
            assert "second time" in str(error), error
            print("raised")
        """)
    done = python_children.run(["-c", script], env={**os.environ, "AUTOCUDA_NATIVE": "1"}, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "raised", (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("native_path", [False, True], ids=["python", "native"])
def test_in_place_changes_of_what_backward_reads_raise(native_path, request):
    """x (kept for backward where save_h=False), a tensor initial state and a learnable parameter changed in place
    between forward and backward: torch's in-place error, on a settled program (its bound launch, or its native
    plan), never a gradient of the changed values; the spikes changed in place (backward reads none) are fine."""
    if native_path:
        request.getfixturevalue("native_on_host")
    x0 = torch.rand(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    v0 = torch.rand(8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def call(change: str, save_h: bool) -> None:
        tensors = {"x": x0.clone().requires_grad_(), "v0": v0.clone().requires_grad_(),
                   "tau": torch.tensor(2.0, dtype=torch.float64, requires_grad=True)}
        spikes, (v,), _ = F.multi_step("lif", tensors["x"], tensors["v0"], backend="host", tau=tensors["tau"],
                                       save_h=save_h)
        with torch.no_grad():
            (spikes if change == "spikes" else tensors[change]).add_(1)
        (spikes.sum() + v.sum()).backward()

    for change, save_h in (("x", False), ("v0", True), ("tau", True), ("tau", False)):
        for _ in range(2):  # settle the program: bound launches, then (native) its plan
            call("spikes", save_h)
        with pytest.raises(RuntimeError, match=MODIFIED):
            call(change, save_h)
