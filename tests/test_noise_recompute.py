"""`recompute=True` on a neuron whose step draws (noisy_cuba_lif): the checkpoint's run in backward draws what the
first run drew, so the gradients equal those of the call without recompute, and the seed source moves on as one
call's draw moves it (the next call draws as it would have). A recomputation that took a fresh seed gave
gradients of another forward (x's off by 0.67 in float64), silently."""
from __future__ import annotations

import pytest
import torch

from autocuda import nn as ann
from autocuda.call import functional as F
from autocuda.codegen.noise import using_generator

SPEC = "noisy_cuba_lif"
X = 2 * torch.rand(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))


def weighted(out: torch.Tensor) -> torch.Tensor:
    return (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).view(out.shape)).sum()


def functional_run(backend: str, recompute: bool, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """A call's spikes and x's gradient, then the next call's spikes (no recompute)."""
    x = X.clone().requires_grad_()
    if generator is None:
        torch.manual_seed(3)
        spikes = F.multi_step(SPEC, x, backend=backend, recompute=recompute)[0]
    else:
        with using_generator(generator):  # backward runs outside the block
            spikes = F.multi_step(SPEC, x, backend=backend, recompute=recompute)[0]
    weighted(spikes).backward()
    if generator is None:
        following = F.multi_step(SPEC, X, backend=backend)[0]
    else:
        with using_generator(generator):
            following = F.multi_step(SPEC, X, backend=backend)[0]
    return [spikes.detach(), x.grad, following]


@pytest.mark.parametrize("backend", ["host", "reference"])
def test_a_recomputed_call_draws_what_its_first_run_drew(backend: str) -> None:
    plain, recomputed = functional_run(backend, False), functional_run(backend, True)
    for want, got in zip(plain, recomputed):
        assert torch.equal(want, got)
    assert plain[1].abs().sum() > 0 and not torch.equal(plain[0], plain[2])  # the draws matter, and move on


def test_a_recomputed_call_under_a_generator_draws_from_it_in_backward_too() -> None:
    plain = functional_run("host", False, torch.Generator().manual_seed(11))
    recomputed = functional_run("host", True, torch.Generator().manual_seed(11))
    for want, got in zip(plain, recomputed):
        assert torch.equal(want, got)


def test_a_layer_with_recompute_gives_the_gradients_of_one_without() -> None:
    results = []
    for recompute in (False, True):
        layer = ann.Neuron(SPEC, step_mode="m", backend="host", recompute=recompute)
        x = X.clone().requires_grad_()
        torch.manual_seed(4)
        spikes = layer(x)
        weighted(spikes).backward()
        results.append((spikes.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
