"""A shared parameter's gradient summed per group of neurons on CUDA (`tests/test_group_sums.py` holds the check):
bitwise the binary tree of the per-neuron partials in every layout the tuner may pick, also where the last warp
ends inside N (its threads past N exit before the sums) and for single steps; and a layer's w gradient, one value,
against the float64 reference."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from autocuda.nn import ParametricLIFNode
from autocuda.runtime import tuning

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_group_sums import check_group_sums  # noqa: E402 - the check of the CPU test, shared

NEURONS = [2 * tuning.MIN_THREADS + 5, 2 * tuning.MIN_THREADS + 64, tuning.LONG_LOOP_NEURONS]


@pytest.mark.parametrize("neurons", NEURONS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_group_sums_are_the_tree_of_the_per_neuron_partials_in_every_layout_on_the_gpu(neurons, dtype):
    layouts = [None, {"lanes": 0, "unroll": 1}, {"lanes": 2, "unroll": 2}, {"lanes": 4, "unroll": 1},
               *tuning.candidates(neurons, dtype, lambda width: True, long=False, draws=True)]
    check_group_sums(neurons, dtype, layouts, "cuda", "cuda")


@pytest.mark.parametrize("neurons", [2 * tuning.MIN_THREADS + 5, 2 * tuning.MIN_THREADS + 64], ids=str)
def test_a_single_step_sums_per_group_on_the_gpu(neurons):
    check_group_sums(neurons, torch.float32, [None, {"lanes": 2}, {"lanes": 4}], "cuda", "cuda", single_step=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_a_layers_shared_parameter_on_the_gpu_gets_the_sum_of_its_groups(dtype):
    torch.manual_seed(0)
    x = torch.rand(4, 3, 20001, dtype=torch.float64).to(dtype).double()  # values the dtype holds
    weights = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).view_as(x)
    grads = []
    for device, backend, cast in (("cuda", "cuda", dtype), ("cpu", "reference", torch.float64)):
        compute = torch.float64 if cast == torch.float64 else torch.float32
        layer = ParametricLIFNode(step_mode="m", backend=backend).to(device=device, dtype=compute)
        xs = x.to(device, cast).requires_grad_()
        (layer(xs).double() * weights.to(device)).sum().backward()
        grads.append(layer.w.grad.double().cpu())
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-3, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(grads[0], grads[1], rtol=tolerance, atol=tolerance)
