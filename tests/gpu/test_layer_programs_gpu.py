"""A layer's programs on CUDA (`autocuda.call.program`, owned by the layer): every change between calls that the key
holds runs the program it asks for, bitwise the unbound path's, through the Python and the native path, at a size
whose kernels load vectors (so that a misaligned x needs its own launch); a layer's keyed call (the native
path's and the bound launch's) in each dtype, also single steps and sequences that go on from tensor states, and
ParametricLIF's with its w among the plan's tensors; and a layer moved between devices."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from autocuda.call import native
from autocuda.nn import LIFNode, Neuron, ParametricLIFNode

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_layer_programs import (  # noqa: E402 - the cores of the CPU test, shared
    CHANGES,
    GAIN_LIF,
    assert_same,
    check_change,
    check_going_on,
    check_keyed,
    check_keyed_steps_of_w,
    check_steps_keyed,
    full_path,
    keyed_runs,
    needs_the_native_operator,
    outcome,
    x_of,
)

CUDA = torch.device("cuda")


@pytest.mark.parametrize("path", ["python", "native"])
@pytest.mark.parametrize("change", [c for c in CHANGES if c != "dtype"] + ["half"])
def test_a_change_between_calls_runs_the_call_it_asks_for_on_the_gpu(change, path, monkeypatch):
    monkeypatch.setattr(native, "USE", path == "native")
    if path == "native" and not native.ensure():
        pytest.skip(f"no native call path: {native.status()}")
    if change == "half":
        monkeypatch.setitem(CHANGES, "half", (lambda layer, x: x.detach().half().requires_grad_(), True))
    layer = Neuron(GAIN_LIF, step_mode="m")
    check_change(change, monkeypatch, layer, x_of((5, 64, 64), torch.float32, change != "grad again", CUDA))


def test_a_layer_whose_input_moves_to_the_gpu_runs_the_gpus_kernels(monkeypatch):
    """The kernels' backends run an input where it lies: only x's device tells the two calls apart."""
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of((4, 8, 33), torch.float32)
    for _ in range(2):
        on_host = outcome(layer, x)
    on_gpu = outcome(layer, x.detach().to(CUDA).requires_grad_())
    assert all(t.is_cuda for t in on_gpu)
    assert_same(on_gpu, full_path(layer, x.detach().to(CUDA).requires_grad_(), monkeypatch), "cuda")
    for gpu, host in zip(on_gpu, on_host, strict=True):
        torch.testing.assert_close(gpu.cpu(), host)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(4, 4096), (4, 8, 16, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("path", ["python", "native"])
def test_a_layer_finds_its_program_by_the_kept_key_on_the_gpu(dtype, shape, grad, path, monkeypatch):
    if path == "native":
        needs_the_native_operator()
    monkeypatch.setattr(native, "USE", path == "native")
    check_keyed(LIFNode(tau=2.0, step_mode="m"), x_of(shape, dtype, grad, CUDA), monkeypatch, path == "native")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_single_steps_and_sequences_going_on_find_their_programs_on_the_gpu(dtype, grad, monkeypatch):
    """Step mode 's' (float states, then tensor states) and sequences that go on from tensor states, by the kept
    key and the native operator, bitwise the full path's."""
    needs_the_native_operator()
    check_steps_keyed(LIFNode(tau=2.0, step_mode="s"), x_of((4, 8, 16, 32), dtype, grad, CUDA), monkeypatch)
    check_going_on(LIFNode(tau=2.0, step_mode="m"), x_of((3, 4, 4096), dtype, grad, CUDA), monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_parametric_lif_takes_the_keyed_call_on_the_gpu(dtype, monkeypatch):
    """ParametricLIF's w (one value, in the compute dtype) among the native plan's tensors: the keyed call's spikes,
    final membrane and gradients (x's and w's) are the full path's bitwise, also after in-place steps of w."""
    needs_the_native_operator()
    x = x_of((4, 8, 16, 32), dtype, True, CUDA)
    layer = ParametricLIFNode(init_tau=2.5, step_mode="m").to(CUDA, torch.float64 if dtype == torch.float64
                                                                  else torch.float32)
    check_keyed_steps_of_w(layer, x, monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_that_keep_no_final_states_on_the_gpu(dtype, monkeypatch):
    """`store_final_states=False`: every call of the native path (the keyed call after the first calls) and of
    torch.compile (Inductor) gives a kept-states layer's spikes and x's gradient from a reset, and the layer keeps no
    state."""
    needs_the_native_operator()
    x = x_of((4, 8, 16, 32), dtype, True, CUDA)
    want = outcome(LIFNode(tau=2.0, step_mode="m"), x)
    ran = keyed_runs(monkeypatch)
    layer, inner = LIFNode(tau=2.0, step_mode="m"), LIFNode(tau=2.0, step_mode="m")
    layer.store_final_states = inner.store_final_states = False
    for call in [layer] * 4 + [torch.compile(inner, fullgraph=True)] * 2:
        out = call(x)
        weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
        assert_same([out, torch.autograd.grad((out * weights).sum(), x)[0]], [want[0], want[2]], "no finals")
        assert type(layer.v) is float and type(inner.v) is float
    assert ran, "the keyed call ran"


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs 2 GPUs, torch.cuda.device_count() is {torch.cuda.device_count()}")


@two_gpus
def test_a_keyed_layer_follows_its_input_to_the_second_gpu(monkeypatch):
    """x's device is part of a call's key: a call on another GPU finds (after its first calls build it) that
    device's program, which then launches on that device while the current device is the first."""
    needs_the_native_operator()
    torch.cuda.set_device(0)
    layer = LIFNode(tau=2.0, step_mode="m")
    first = x_of((4, 4096), torch.float32, True, "cuda:0")
    second = first.detach().to("cuda:1").requires_grad_()
    for x in (first, first, second, second):  # on each GPU: the training program's native plan after a backward
        got = outcome(layer, x)
        assert all(t.device == x.device for t in got)
        assert_same(got, full_path(layer, x, monkeypatch), x.device)
    ran = keyed_runs(monkeypatch)
    for x in (second, first):
        got = outcome(layer, x)
        assert_same(got, full_path(layer, x, monkeypatch), x.device)
    assert ran == [((4, 4096), True)] * 2, "each GPU's x ran its own program by the key"


@two_gpus
def test_data_parallel_replicas_of_a_keyed_layer_give_the_single_gpu_results():
    """DataParallel's replicas share the layer's programs (a shallow copy of its dict) and run in threads, each on
    its own GPU: every call gives the results of the layer on the whole input on one GPU."""
    needs_the_native_operator()
    torch.cuda.set_device(0)
    layer = LIFNode(tau=2.0, step_mode="m").to(CUDA)
    x = x_of((4, 8, 512), torch.float32, False, "cuda:0")
    want = outcome(layer, x)[0]
    model = torch.nn.DataParallel(layer, device_ids=[0, 1], dim=1)
    for _ in range(4):
        layer.reset()
        assert torch.equal(model(x), want)
