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


# A power of a runtime exponent whose base reaches 0: the membrane after a hard reset to 0, and |x| at x = 0
POWERS = """
name = "variable_power"
charge = "v + 0.1 * v ** q + abs(x) ** p"
[params]
v_threshold = 1.0
v_reset = 0.0
q = 2.0
p = { default = 1.5, learnable = true }
[states]
v = "v_reset"
"""


@NEEDS_HOST
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_powers_of_a_runtime_exponent_have_torchs_gradients_where_their_base_is_zero(dtype: torch.dtype) -> None:
    """d(b**e)/db = e * b**(e - 1) and d(b**e)/de = 0 at b = 0 (torch's pow: the reference's), not sympy's
    e * b**e / b and b**e * log(b), which are NaN there and made every earlier step's gradient NaN."""
    spec = spec_from_toml(POWERS)
    grads = []
    for backend in ("reference", "host"):
        x = torch.tensor([[0.0, 0.5, -1.0], [0.6, 0.0, 0.0], [0.5, 0.0, 0.3], [0.2, 0.7, 0.0]], dtype=dtype,
                         requires_grad=True)
        p = torch.full((3,), 1.5, dtype=dtype, requires_grad=True)
        spikes, (v,), _ = F.multi_step(spec, x, backend=backend, p=p)
        (spikes.sum() + v.sum()).backward()
        grads.append((x.grad, p.grad))
    assert all(torch.isfinite(g).all() for g in (*grads[0], *grads[1]))
    tolerance = 1e-12 if dtype == F64 else 1e-5
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
