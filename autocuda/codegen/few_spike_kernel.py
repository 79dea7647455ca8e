"""The kernels of few-spike coding (SpikingJelly's FewSpikeNode, HGNode and OutlierAwareThresholdNode,
`nn.spikingjelly_few_spike`): per neuron, a gate (x, or the sum of a sequence's K inputs), a table row picked by the
gate's region, and K steps of z = Θ(v - θ_k), v -= h_k z, output d_k z (`templates/few_spike.cu.j2`); `signed`
(OutlierAwareThresholdNode) steps the clamped gate's magnitude and signs the outputs. The backward kernel rebuilds
the steps from x and runs them back with the surrogate's gradient (printed from its sympy form). Built once per
(K, regions, dtype, surrogate, sequence or one step, signed).
"""
from __future__ import annotations

import functools
import hashlib

import sympy

from ..spec.surrogate import Surrogate
from .ckernel import CKernel1D
from .dtypes import fill, get_dtype
from .printer import print_expr

__all__ = ["FewSpikeKernel", "few_spike_kernels"]

MAX_STEPS = 64  # a neuron's K steps are held in registers


class FewSpikeKernel(CKernel1D):
    """The forward or (`backward`) backward few-spike kernel."""

    template = "few_spike.cu.j2"

    def __init__(self, name: str, steps: int, regions: int, dtype: str, surrogate: Surrogate, sequence: bool,
                 backward: bool, signed: bool = False):
        super().__init__(name)
        stored = get_dtype(dtype)
        element, compute = stored.element if stored.packed else stored.ctype, stored.compute
        self.steps, self.regions, self.dtype = steps, regions, stored
        self.surrogate, self.sequence, self.backward, self.signed = surrogate, sequence, backward, signed
        self.add_param(f"const {element} *", "x")
        for table in ("theta", "h", "d", "thresholds"):
            self.add_param(f"const {compute.ctype} *", table)
        if signed:
            self.add_param(f"const {compute.ctype}", "clamp_value")
        if backward:
            self.add_param(f"const {element} *", "grad_out")
            self.add_param("const long long", "grad_step")  # grad_out's strides, in elements
            self.add_param("const long long", "grad_neuron")
        self.add_param(f"{element} *", "grad_x" if backward else "out")

    def _context(self) -> dict:
        stored, compute = self.dtype, self.dtype.compute
        at = "[(long long)k * numel + index]" if self.sequence else "[index]"
        grad_at = "[k * grad_step + index * grad_neuron]" if self.sequence else "[index * grad_neuron]"
        u = sympy.Symbol("u", real=True)
        context = super()._context()
        signed = self.signed
        context.update(steps=self.steps, regions=self.regions, compute=compute.ctype, zero=compute.literal(0.0),
                       one=compute.literal(1.0), sequence=self.sequence, backward=self.backward, signed=signed,
                       clamped=compute.op("minimal", x=compute.op("maximum", x="gate", y="-clamp_value"),
                                          y="clamp_value"),
                       magnitude=compute.op("abs", x="clamped"),
                       load_x=fill(stored.element_load, x="x" + at),
                       load_grad=fill(stored.element_load, x="grad_out" + grad_at),
                       heaviside_u=compute.op("heaviside", x="us[k]"), heaviside_u0=compute.op("heaviside", x="u"),
                       store_dz=fill(stored.element_store, x="(d_r[k] * z) * sign" if signed else "d_r[k] * z"),
                       store_total=fill(stored.element_store, x="total * sign" if signed else "total"),
                       store_dv=fill(stored.element_store, x="dv"),
                       gradient=f"({print_expr(self.surrogate.gradient(u), compute.name, {u: 'u'})})")
        return context


@functools.lru_cache(maxsize=64)
def few_spike_kernels(steps: int, regions: int, dtype: str, surrogate: Surrogate, sequence: bool,
                      signed: bool = False) -> tuple[FewSpikeKernel, FewSpikeKernel]:
    """The forward and backward kernels for K = `steps`, `regions` table rows, `dtype`, `surrogate` (a frozen one:
    its values are the kernels'), a sequence's K inputs or one step's gate, and (`signed`) steps on the clamped
    gate's magnitude, the outputs signed."""
    if not 1 <= steps <= MAX_STEPS or regions < 1:
        raise ValueError(f"few-spike kernels: K must be in [1, {MAX_STEPS}] and regions >= 1, got {steps}, {regions}")
    digest = hashlib.sha1(repr(surrogate.key()).encode()).hexdigest()[:8]
    kind = ("m" if sequence else "s") + ("_signed" if signed else "")
    name = f"few_spike_{get_dtype(dtype).name}_k{steps}_r{regions}_{kind}_{digest}"
    return (FewSpikeKernel(name, steps, regions, dtype, surrogate, sequence, False, signed),
            FewSpikeKernel(f"{name}_backward", steps, regions, dtype, surrogate, sequence, True, signed))
