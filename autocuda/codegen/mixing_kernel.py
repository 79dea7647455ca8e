"""The kernels of a mixing over time then a threshold (SpikingJelly's parallel spiking neurons, `nn.psn`): over
[T, N] rows x, H = W x + b and S = Θ(H), with W [T, T] and b [T] in the compute type, one thread per word of
`lanes` neighbouring neurons (`templates/mixing.cu.j2`; 1 or 2, `LANES`: a pair is one access of the rows, and
the weights read once serve both). Every thread reads the same weights and biases, in the widest aligned vectors a
row of T allows (`weight_chunk_bytes`: a warp's read is one access, so a word costs T² / chunk of them rather
than T²). A neuron's sums run in the same order whatever the lanes: the same spikes and grad_x.

The forward kernel writes the spikes. The backward kernel rebuilds H from x (nothing is saved but x), and writes
grad_h = grad_spike · σ'(H) (σ' the surrogate's gradient, printed from its sympy form) and grad_x = Wᵀ grad_h:
the weights' and biases' gradients are reductions over the neurons, grad_h xᵀ and Σ grad_h, which the caller takes
with torch's matrix product and sum. For T up to FUSED_STEPS the fused backward kernel takes those reductions itself
and writes no grad_h: each thread sums its neurons' terms (a grid-stride loop), a block sums its threads' (warp
shuffles, then shared memory) and adds them into the [T, T] and [T] gradients with one atomic each (the order of
those additions varies from run to run: the caller takes the other kernel under torch's deterministic algorithms).
Three of these kernels per (T, dtype, surrogate, lanes), built once.
"""
from __future__ import annotations

import functools
import hashlib

import sympy

from ..spec.surrogate import Surrogate
from .ckernel import CKernel1D
from .dtypes import fill, get_dtype
from .options import VECTOR_CTYPES
from .printer import print_expr

__all__ = ["FUSED_STEPS", "LANES", "PAIRED_ITEMSIZES", "PAIRED_MAX_STEPS", "MixingKernel", "mixing_kernels",
           "weight_chunk_bytes"]

MAX_STEPS = 64  # the rows' values of one neuron are held in registers: longer sequences compose torch ops
# Neurons a thread takes as one word of its rows: 2 where the rows' length is even (one access for both, and one
# read of the weights for both), for elements of PAIRED_ITEMSIZES bytes (float64's fused backward would spill) and
# T up to PAIRED_MAX_STEPS (at T = 64 the float32 backward spills: its training step is slower paired)
LANES = (1, 2)
PAIRED_ITEMSIZES = (2, 4)
PAIRED_MAX_STEPS = 32
FUSED_STEPS = 8  # the fused backward holds T² + T sums per thread in registers: up to T = 8
# Its float sums in at most 128 registers a thread, so that two blocks of 256 threads fit a multiprocessor (double
# sums would spill: no bound there)
FUSED_LAUNCH_BOUNDS = "256, 2"


class MixingKernel(CKernel1D):
    """One of the two mixing kernels (`backward` or not) for T = `steps` and the rows' dtype."""

    template = "mixing.cu.j2"

    def __init__(self, name: str, steps: int, dtype: str, surrogate: Surrogate, backward: bool, fused: bool = False,
                 lanes: int = 1):
        super().__init__(name)
        stored = get_dtype(dtype)
        element, compute = stored.element if stored.packed else stored.ctype, stored.compute
        if lanes not in LANES:
            raise ValueError(f"mixing kernels: lanes must be one of {LANES}, got {lanes!r}")
        self.steps, self.dtype, self.surrogate, self.backward, self.fused = steps, stored, surrogate, backward, fused
        self.lanes, self.element = lanes, element
        self.chunk_bytes = weight_chunk_bytes(steps, compute.torch_dtype.itemsize)
        if fused and compute.name == "float32":
            self.launch_bounds = FUSED_LAUNCH_BOUNDS
        self.add_param(f"const {element} *", "x")
        self.add_param(f"const {compute.ctype} *", "weight")
        self.add_param(f"const {compute.ctype} *", "bias")
        if backward:
            self.add_param(f"const {element} *", "grad_spike")
            self.add_param("const long long", "grad_step")  # grad_spike's strides, in elements
            self.add_param("const long long", "grad_neuron")
        for name in ("grad_x",) if fused else ("grad_h", "grad_x") if backward else ("spike",):
            self.add_param(f"{element} *", name)
        if fused:  # the sums over the neurons, added into (zeroed by the caller)
            self.add_param(f"{compute.ctype} *", "grad_weight")
            self.add_param(f"{compute.ctype} *", "grad_bias")

    def _context(self) -> dict:
        stored, compute = self.dtype, self.dtype.compute

        def load(element: str) -> str:
            return fill(stored.element_load, x=element)

        h = sympy.Symbol("h", real=True)
        context = super()._context()
        context.update(steps=self.steps, compute=compute.ctype, backward=self.backward, fused=self.fused,
                       zero=compute.literal(0.0),
                       lanes=self.lanes, element=self.element,
                       lane_vector=VECTOR_CTYPES.get(self.lanes * stored.torch_dtype.itemsize, ""),
                       load_x=load("ac_in[l]"),
                       load_grad_spike=load(f"grad_spike[t * grad_step + ((long long)index * {self.lanes} + l) * "
                                            "grad_neuron]"),
                       store_spike=fill(stored.element_store, x=compute.op("heaviside", x="h")),
                       store_grad_h=fill(stored.element_store, x="grad_h_t"),
                       store_grad_x=fill(stored.element_store, x="gx[l][j]"),
                       chunk=self.chunk_bytes // compute.torch_dtype.itemsize,
                       vector=VECTOR_CTYPES.get(self.chunk_bytes, ""),
                       gradient=f"({print_expr(self.surrogate.gradient(h), compute.name, {h: 'h'})})")
        return context


def weight_chunk_bytes(steps: int, itemsize: int) -> int:
    """Bytes of one read of the weights and biases: the widest vector access (`VECTOR_CTYPES`, 16 or 8 bytes) of
    more than one value that divides a row of T values, else one value. Every thread reads the same weights, so
    each read is one access of the whole warp: vectors make T² / chunk of them a neuron rather than T²."""
    for size in (16, 8):
        chunk = size // itemsize
        if chunk > 1 and steps % chunk == 0:
            return size
    return itemsize


@functools.lru_cache(maxsize=64)
def mixing_kernels(steps: int, dtype: str, surrogate: Surrogate, lanes: int = 1
                   ) -> tuple[MixingKernel, MixingKernel, MixingKernel | None]:
    """The forward, backward and fused backward (None beyond FUSED_STEPS) kernels for T = `steps` rows of `dtype`
    and `surrogate` (a frozen one: its values are the kernels'), each thread taking `lanes` neurons."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"mixing kernels: T must be in [1, {MAX_STEPS}], got {steps}")
    digest = hashlib.sha1(repr(surrogate.key()).encode()).hexdigest()[:8]
    name = f"mixing_{get_dtype(dtype).name}_t{steps}_{digest}" + (f"_x{lanes}" if lanes > 1 else "")
    fused = MixingKernel(f"{name}_backward_fused", steps, dtype, surrogate, True, True, lanes) \
        if steps <= FUSED_STEPS else None
    return (MixingKernel(name, steps, dtype, surrogate, False, lanes=lanes),
            MixingKernel(f"{name}_backward", steps, dtype, surrogate, True, lanes=lanes), fused)
