"""The kernels of the DSR neurons' rate rule (SpikingJelly's DSRIFNode and DSRLIFNode, `nn.spikingjelly_dsr`;
`templates/dsr.cu.j2`): the layer's output from the spikes (s times the threshold over a divisor, the threshold read
from device memory, so a learnable one needs no copy to the host), and the rule's backward in one pass over the
steps per neuron: the time-weighted rates of x and of the output's gradient, the input gradient every step takes, and
the threshold's per-neuron gradient. The spikes themselves come from the `dsr` spec's kernels. Built once per
dtype (and, for the backward, strict or closed bounds).
"""
from __future__ import annotations

import functools

from .ckernel import CKernel1D
from .dtypes import fill, get_dtype

__all__ = ["DSRKernel", "dsr_backward_kernel", "dsr_output_kernel"]


class DSRKernel(CKernel1D):
    """The output kernel (`output`) or the backward kernel of the rate rule."""

    template = "dsr.cu.j2"

    def __init__(self, name: str, dtype: str, output: bool, strict: bool = False):
        super().__init__(name)
        stored = get_dtype(dtype)
        element, compute = stored.element if stored.packed else stored.ctype, stored.compute
        self.dtype, self.output, self.strict = stored, output, strict
        self.add_param("const long long", "steps")
        self.add_param(f"const {compute.ctype} *", "v_th")  # one value, in device memory
        if output:
            self.add_param(f"const {element} *", "s")
            self.add_param(f"const {compute.ctype}", "divisor")
            self.add_param(f"{element} *", "out")
            return
        self.add_param(f"const {element} *", "x")
        self.add_param(f"const {element} *", "grad_out")
        self.add_param("const long long", "grad_step")  # grad_out's strides, in elements
        self.add_param("const long long", "grad_neuron")
        self.add_param(f"const {compute.ctype} *", "weights")
        for name in ("weight_sum", "bound_factor", "value_divisor"):
            self.add_param(f"const {compute.ctype}", name)
        self.add_param(f"{element} *", "grad_x")
        self.add_param(f"{compute.ctype} *", "partial")

    def _context(self) -> dict:
        stored, compute = self.dtype, self.dtype.compute
        context = super()._context()
        context.update(compute=compute.ctype, zero=compute.literal(0.0), output=self.output, strict=self.strict,
                       load_s=fill(stored.element_load, x="s[t * numel + index]"),
                       store_out=fill(stored.element_store, x="spike * value"),
                       load_x=fill(stored.element_load, x="x[t * numel + index]"),
                       load_grad=fill(stored.element_load, x="grad_out[t * grad_step + index * grad_neuron]"),
                       store_value=fill(stored.element_store, x="value"))
        return context


@functools.lru_cache(maxsize=8)
def dsr_output_kernel(dtype: str) -> DSRKernel:
    """The output kernel for `dtype`."""
    return DSRKernel(f"scaled_spikes_{get_dtype(dtype).name}", dtype, True)


@functools.lru_cache(maxsize=8)
def dsr_backward_kernel(dtype: str, strict: bool) -> DSRKernel:
    """The backward kernel for `dtype`; `strict`: the rate's bounds excluded (the LIF's rule), else included (the
    IF's)."""
    return DSRKernel(f"dsr_rate_backward_{get_dtype(dtype).name}_{'strict' if strict else 'closed'}", dtype, False,
                     strict)
