"""A BPTT kernel in two passes (`gradients="sums"`, then `"corrected"`), a BatchNorm's backward: the first stores
the per-channel sums alone, the second every other gradient, the input's with c1[c] * x + c0[c] added. Together
they give what one kernel gives, that term added."""
from __future__ import annotations

import pytest
import torch

from autocuda.codegen.broadcast import PER_CHANNEL
from autocuda.kernels import neuron_kernel
from autocuda.runtime.neuron_launch import NeuronConfig, backward, forward
from autocuda.spec.load import load_spec
from autocuda.spec.transform import INPUT_SCALE, INPUT_SHIFT, with_input_affine

T, B, C, INNER = 11, 3, 4, 5
N = B * C * INNER


@pytest.mark.parametrize("replay_charge", [False, True], ids=["h-saved", "h-replayed"])
@pytest.mark.parametrize("name", ["lif", "parametric_lif", "izhikevich"])
def test_two_passes_give_one_kernels_gradients_and_the_term(name, replay_charge):
    spec = with_input_affine(load_spec(name))
    shared = tuple((p.name, False) for p in spec.params
                   if p.kind == "tensor" and p.name not in (INPUT_SCALE, INPUT_SHIFT))
    tensors = ((INPUT_SCALE, PER_CHANNEL), (INPUT_SHIFT, PER_CHANNEL), *shared)
    config = NeuronConfig(spec, spec.surrogate, spec.reset, tensors=tensors, replay_charge=replay_charge)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, N, generator=gen, dtype=torch.float64) + 0.8
    params = {p.name: p.default for p in spec.params}
    params |= {name: torch.tensor([float(params[name])], dtype=torch.float64) for name, _ in shared}
    params |= {INPUT_SCALE: torch.rand(C, dtype=torch.float64) + 0.5,
               INPUT_SHIFT: torch.rand(C, dtype=torch.float64) * 0.3, "ac_channels": C, "ac_inner": INNER}
    init = {s.name: torch.rand(N, generator=gen, dtype=torch.float64) * 0.5 for s in spec.states}
    out = forward(config, x, init, params, backend="host")
    assert out["spike_seq"].sum() > 0
    grads = {"grad_spike_seq": torch.randn(T, N, generator=gen, dtype=torch.float64),
             **{f"grad_{s.name}_final": torch.randn(N, generator=gen, dtype=torch.float64) for s in spec.states}}
    saved = {**out, **{f"{k}_init": v for k, v in init.items()}, "x_seq": x}
    one = backward(config, grads, saved, params, backend="host")
    sums = backward(config, grads, saved, params, backend="host", gradients="sums")
    c1, c0 = torch.randn(C, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    terms = {"ac_grad_x_scale": c1, "ac_grad_x_shift": c0}
    rest = backward(config, grads, saved, params | terms, backend="host", gradients="corrected")
    channel_grads = {f"grad_{INPUT_SCALE}", f"grad_{INPUT_SHIFT}"}
    assert set(sums) == channel_grads and not set(rest) & channel_grads
    assert set(sums) | set(rest) == set(one)
    for key in channel_grads:
        torch.testing.assert_close(sums[key], one[key], rtol=1e-12, atol=1e-12)
    channel = (torch.arange(N) // INNER) % C
    torch.testing.assert_close(rest["grad_x_seq"], one["grad_x_seq"] + c1[channel] * x + c0[channel], rtol=1e-12,
                               atol=1e-12)
    for key in set(rest) - {"grad_x_seq"}:
        assert torch.equal(rest[key], one[key]), key


def test_passes_need_bptt_with_per_channel_parameters():
    spec = with_input_affine(load_spec("lif"))
    channel = {"tensors": [INPUT_SCALE, INPUT_SHIFT], "per_channel": [INPUT_SCALE, INPUT_SHIFT]}
    with pytest.raises(ValueError, match="a BPTT kernel with per-channel parameters only"):
        neuron_kernel(spec, "bptt", "float32", gradients="sums")
    with pytest.raises(ValueError, match="a BPTT kernel with per-channel parameters only"):
        neuron_kernel(spec, "step-backward", "float32", gradients="corrected", **channel)
    with pytest.raises(ValueError, match="gradients: expected one of"):
        neuron_kernel(spec, "bptt", "float32", gradients="some", **channel)
    assert neuron_kernel(spec, "bptt", "float32", **channel).kernel_name == \
        neuron_kernel(spec, "bptt", "float32", gradients="all", **channel).kernel_name
