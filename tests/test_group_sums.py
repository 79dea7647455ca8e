"""A shared learnable parameter's gradient leaves the backward kernels as one partial sum per group of
`GRADIENT_GROUP` neurons (`codegen.broadcast`): each group's sum is one binary tree over its neurons below N, the
same in every layout, so it equals, bitwise, that tree over the per-neuron partials which the same parameter read
per neuron gives; every other output is unchanged. `check_group_sums` is shared with the GPU test."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import torch
from backends import NEEDS_HOST

from autocuda.codegen.broadcast import GRADIENT_GROUP, PER_NEURON, SHARED, gradient_groups
from autocuda.nn import ParametricLIFNode
from autocuda.runtime.configs import compute_dtype
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import load_spec
from autocuda.tools.testing import named_launch


def group_tree(partials: torch.Tensor) -> torch.Tensor:
    """The kernels' sums of per-neuron partials [N], one per group of neurons: at distances 1, 2, 4, ... neurons,
    each group's first neuron of a pair of blocks adds the other block's sum where that block starts below N."""
    n, rows = len(partials), gradient_groups(len(partials))
    values = partials.new_zeros(rows * GRADIENT_GROUP)
    values[:n] = partials
    values = values.view(rows, GRADIENT_GROUP)
    valid = (torch.arange(rows * GRADIENT_GROUP, device=partials.device) < n).view(rows, GRADIENT_GROUP)
    distance = 1
    while distance < GRADIENT_GROUP:
        first, other = values[:, 0::2 * distance], values[:, distance::2 * distance]
        values[:, 0::2 * distance] = torch.where(valid[:, distance::2 * distance], first + other, first)
        distance *= 2
    return values[:, 0].clone()


def run_parametric_lif(spread: Any, x: torch.Tensor, g: torch.Tensor, layout: Mapping[str, Any] | None,
                       backend: str, single_step: bool = False) -> dict[str, torch.Tensor]:
    """Forward and backward kernels of ParametricLIF with its w (0.3) shared or per neuron."""
    spec = load_spec("parametric_lif")
    config = NeuronConfig(spec, spec.surrogate, "hard", tensors=(("w", spread),))
    n = x.shape[-1]
    w = torch.full((1,) if spread is SHARED else (n,), 0.3, device=x.device, dtype=compute_dtype(x.dtype))
    params = {p.name: p.default for p in spec.params if p.kind != "tensor"} | {"w": w}
    out = named_launch.forward(config, x, {"v": 0.0}, params, single_step=single_step, backend=backend,
                               layout=layout)
    saved = {"h_seq": out["h_seq"], "x_seq": x, "v_init": 0.0}
    return out | named_launch.backward(config, {"grad_spike_seq": g}, saved, params, single_step=single_step,
                                       grad_finals=False, given_inits=False, backend=backend, layout=layout)


def check_group_sums(neurons: int, dtype: torch.dtype, layouts: Iterable[Mapping[str, Any] | None],
                     device: str, backend: str, single_step: bool = False) -> None:
    steps = () if single_step else (5,)
    x = (torch.rand(*steps, neurons, device=device) * 2).to(dtype)
    g = torch.randn(*steps, neurons, device=device).to(dtype)
    by_neuron = run_parametric_lif(PER_NEURON, x, g, None, backend, single_step)
    want = group_tree(by_neuron["grad_w"])
    assert want.abs().sum() > 0
    for layout in layouts:
        shared = run_parametric_lif(SHARED, x, g, layout, backend, single_step)
        assert shared["grad_w"].shape == (gradient_groups(neurons),), layout
        assert torch.equal(shared["grad_w"], want), f"{layout}: the group sums are not the tree's"
        for key in by_neuron.keys() - {"grad_w"}:
            assert torch.equal(shared[key], by_neuron[key]), f"{layout}: {key} differs"


HOST_LAYOUTS = [None, {"lanes": 2, "unroll": 2}, {"lanes": 4, "unroll": 1}, {"lanes": 2, "vector": True},
                {"lanes": 2, "unroll": 2, "block": 64}]


@NEEDS_HOST
@pytest.mark.parametrize("neurons", [1, 31, 77, 100], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_group_sums_are_the_tree_of_the_per_neuron_partials_in_every_layout(neurons, dtype):
    layouts = [layout for layout in HOST_LAYOUTS
               if layout is None or not layout.get("vector") or neurons % layout["lanes"] == 0]
    check_group_sums(neurons, dtype, layouts, "cpu", "host")


@NEEDS_HOST
@pytest.mark.parametrize("neurons", [33, 100], ids=str)
def test_a_single_step_sums_per_group_too(neurons):
    check_group_sums(neurons, torch.float32, [None, {"lanes": 4}], "cpu", "host", single_step=True)


def test_group_sums_are_refused_where_a_thread_holds_no_whole_part_of_a_group():
    from autocuda.codegen.kernels import neuron_kernel

    spec = load_spec("parametric_lif")
    with pytest.raises(ValueError, match="whole warps"):
        neuron_kernel(spec, "bptt", "float32", tensors=["w"], block=48).full_codes  # noqa: B018


@NEEDS_HOST
def test_a_layers_shared_parameter_gets_the_sum_of_its_groups():
    """Through a layer (the native call where built, else the Python path): w's gradient, one value, is the sum
    of the groups' sums, against the torch reference."""
    torch.manual_seed(0)
    x = torch.rand(4, 3, 45, dtype=torch.float64)
    grads = []
    for backend in ("host", "reference"):
        layer = ParametricLIFNode(step_mode="m", backend=backend).double()
        xs = x.clone().requires_grad_()
        (layer(xs) * torch.arange(xs.numel(), dtype=torch.float64).view_as(xs)).sum().backward()
        grads.append(layer.w.grad)
    assert grads[0].shape == grads[1].shape == ()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
