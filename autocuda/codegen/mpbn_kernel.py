"""The kernels of SpikingJelly's MPBN LIF neuron (`nn.spikingjelly_mpbn`, `call.mpbn`; `templates/mpbn.cu.j2`): the
LIF charge, a BatchNorm of the membrane over the batch at every step, then the fire and reset, one launch per step
(the statistics of a step need every neuron's h of that step); the backward one launch per step in reverse, the
BatchNorm's backward from per-channel sums the kernels add up themselves. Built once per dtype (the backward per
dtype and surrogate).
"""
from __future__ import annotations

import functools
import hashlib

import sympy

from ..spec.surrogate import Surrogate
from .ckernel import CKernel1D
from .dtypes import fill, get_dtype
from .printer import print_expr

__all__ = ["MPBNKernel", "mpbn_backward_kernel", "mpbn_forward_kernel"]

# Flags the kernels take at run time (uniform branches): the charge's form, the reset, and what a call gives
_FORWARD_FLAGS = ("training", "decay_input", "hard", "v0_per_neuron")
_BACKWARD_FLAGS = ("training", "decay_input", "hard", "detach_reset", "has_grad_final", "wants_grad_v0")


class MPBNKernel(CKernel1D):
    """The forward step kernel, or the backward one (for `surrogate`)."""

    template = "mpbn.cu.j2"

    def __init__(self, name: str, dtype: str, surrogate: Surrogate | None = None):
        super().__init__(name)
        stored = get_dtype(dtype)
        element, compute = stored.element if stored.packed else stored.ctype, stored.compute.ctype
        self.dtype, self.surrogate = stored, surrogate
        backward = surrogate is not None
        for name in ("t", "steps", "inner", "channels"):
            self.add_param("const long long", name)
        self.add_param("const double", "count")
        for name in _BACKWARD_FLAGS if backward else _FORWARD_FLAGS:
            self.add_param("const int", name)
        scalars = ("tau", "v_reset", "v_threshold") if backward else (
            "tau", "v_reset", "v_threshold", "eps", "momentum", "unbias")
        for name in scalars:
            self.add_param(f"const {compute}", name)
        if backward:
            for name in ("h", "mean", "invstd", "gamma", "beta"):
                self.add_param(f"const {compute} *", name)
            self.add_param(f"const {element} *", "grad_spike")
            self.add_param("const long long", "grad_step")  # grad_spike's strides, in elements
            self.add_param("const long long", "grad_neuron")
            self.add_param(f"const {element} *", "grad_final")
            self.add_param(f"{compute} *", "g")
            self.add_param("double *", "sums")
            self.add_param(f"{element} *", "grad_x")
            self.add_param(f"{element} *", "grad_v0")
            return
        self.add_param(f"const {element} *", "x")
        self.add_param(f"const {element} *", "v0")
        self.add_param(f"{compute} *", "h")
        self.add_param(f"{element} *", "spike")
        self.add_param(f"{element} *", "v_final")
        self.add_param("double *", "sums")
        for name in ("mean", "invstd", "running_mean", "running_var"):
            self.add_param(f"{compute} *", name)
        for name in ("gamma", "beta"):
            self.add_param(f"const {compute} *", name)

    def _context(self) -> dict:
        stored, compute = self.dtype, self.dtype.compute

        def load(text: str) -> str:
            return fill(stored.element_load, x=text)

        def store(text: str) -> str:
            return fill(stored.element_store, x=text)

        z = sympy.Symbol("z", real=True)
        context = super()._context()
        context.update(compute=compute.ctype, backward=self.surrogate is not None, zero=compute.literal(0.0),
                       one=compute.literal(1.0), fire=compute.op("heaviside", x="z"),
                       load_x=load("x[t * numel + index]"), load_v0=load("v0[index]"), load_v0_first=load("v0[0]"),
                       store_spike=store("s"), store_v=store("v"), store_dx=store("dx"), store_gv=store("gv"),
                       load_grad_final=load("grad_final[index]"),
                       load_grad_spike=load("grad_spike[(t - 1) * grad_step + index * grad_neuron]"))
        if self.surrogate is not None:
            context["gradient"] = f"({print_expr(self.surrogate.gradient(z), compute.name, {z: 'z'})})"
        return context


@functools.lru_cache(maxsize=8)
def mpbn_forward_kernel(dtype: str) -> MPBNKernel:
    """The forward step kernel for `dtype`."""
    return MPBNKernel(f"mpbn_forward_{get_dtype(dtype).name}", dtype)


@functools.lru_cache(maxsize=64)
def mpbn_backward_kernel(dtype: str, surrogate: Surrogate) -> MPBNKernel:
    """The backward step kernel for `dtype` and `surrogate` (a frozen one: its values are the kernel's)."""
    digest = hashlib.sha1(repr(surrogate.key()).encode()).hexdigest()[:8]
    return MPBNKernel(f"mpbn_backward_{get_dtype(dtype).name}_{digest}", dtype, surrogate)
