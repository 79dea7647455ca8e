"""The kernels' gradient of a learnable parameter that a state's update reads (`y = ... + a * 2`): d loss / d a
sums, over the steps, λ_y(t) · ∂y'/∂a, where λ_y(t) is the gradient of the step's *new* y. The backward kernel
must add a parameter's term before its λ registers take the previous step's values (`kernel_plans`)."""
from __future__ import annotations

import pytest
import torch
from backends import NEEDS_HOST

from autocuda.call import functional as F
from autocuda.spec.load import spec_from_toml

F64 = torch.float64

UPDATE_PARAM = """
name = "update_param"
charge = "v * 0.5 + x"
[params]
v_threshold = 0.5
v_reset = 0.0
a = { default = 0.3, learnable = true }
[states]
v = "v_reset"
y = 0.0
[updates]
y = "0.5 * y + s + a * 2.0"
"""


@NEEDS_HOST
@pytest.mark.parametrize("read", ["sequence", "final"])
def test_kernels_give_an_updates_parameter_its_gradient(read: str) -> None:
    """The output noise's scale of the shipped noisy_cuba_lif is such a parameter (its y = s + sigma_s * randn())."""
    spec = spec_from_toml(UPDATE_PARAM)
    grads = []
    for backend in ("reference", "host"):
        x = torch.linspace(0, 1, 12, dtype=F64).view(4, 3).requires_grad_()
        a = torch.tensor(0.3, dtype=F64, requires_grad=True)
        _, finals, seqs = F.multi_step(spec, x, store_state_seq=True, backend=backend, a=a)
        (seqs[1].sum() if read == "sequence" else finals[1].sum()).backward()
        grads.append(a.grad)
    assert grads[0] == (36.75 if read == "sequence" else 11.25)  # 2 · Σ_t Σ_k 0.5^k, over 3 neurons
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@NEEDS_HOST
def test_the_single_step_kernel_gives_it_too() -> None:
    """The step-backward kernel: d y' / d a = 2 for each of 3 neurons."""
    spec = spec_from_toml(UPDATE_PARAM)
    grads = []
    for backend in ("reference", "host"):
        x = torch.linspace(0, 1, 3, dtype=F64).requires_grad_()
        a = torch.tensor(0.3, dtype=F64, requires_grad=True)
        _, (v, y) = F.single_step(spec, x, 0.0, 0.5, backend=backend, a=a)
        y.sum().backward()
        grads.append(a.grad)
    assert grads[0] == 6.0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)
