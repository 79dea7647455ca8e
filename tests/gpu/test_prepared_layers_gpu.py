"""A layer's last prepared call on CUDA (`prepared.layer_multi_step`): every change between calls that the key
holds runs the call it asks for, bitwise the full path's, through the Python and the native path, at a size
whose kernels load vectors (so that a misaligned x needs its own launch); a layer's settled call (the native
path's) in each dtype; and a layer moved between devices."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from autocuda import native
from autocuda.nn import LIFNode, Neuron

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_prepared_layers import (  # noqa: E402 - the cores of the CPU test, shared
    CHANGES,
    GAIN_LIF,
    assert_same,
    check_change,
    check_settled,
    full_path,
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
def test_a_layer_reruns_its_settled_call_on_the_gpu(dtype, shape, grad, monkeypatch):
    needs_the_native_operator()
    check_settled(LIFNode(tau=2.0, step_mode="m"), x_of(shape, dtype, grad, CUDA), monkeypatch)
