"""Check generated neuron kernels against the reference: hypothesis strategies and `check_spec`.

One *case* is a setup (spec x dtype x reset x detach_reset) with one random input set. Checking it:
  1. the float64 inputs are rounded to what the kernel sees (x, states and incoming gradients to the storage
     dtype; parameters to the arithmetic dtype), so kernel and reference compute from identical values;
  2. the reference (`autocuda.reference`, float64, autograd through the surrogate) gives spikes, h, states and
     the gradients of x, of the initial states and of every learnable parameter (per neuron);
  3. the generated kernels run through `autocuda.testing.named_launch` on the chosen backend: FPTT, then BPTT on what
     that forward saved; step-forward, then step-backward, for one step from states the dynamics reached;
  4. every output is compared within the dtype's tolerance (TOLERANCES), spikes exactly.

Spikes are discontinuous. Where h is within rounding of the threshold the kernel may rightly decide otherwise
than the reference, and from then on that neuron's states legitimately differ. Such neurons are *ambiguous*:
their forward outputs are compared only before their first ambiguous step, and none of their gradients (the
adjoint of step t depends on every later step). Restarting each step from the reference's states (teacher
forcing) would be finer, but a fused multi-step kernel cannot be restarted; masking drops only neurons on which
both computations may legitimately disagree, and the report counts them.

Limits: surrogate gradients with jumps away from 0 (PiecewiseQuadratic's |z| = 1/alpha and the like) are not
masked; a rounding-sized difference there can fail a low-precision check.

Use: `check_spec(spec, backend="host", raise_on_failure=True)` runs a few seeded cases of every variant; in a
hypothesis test, `@given(case=cases(Setup(spec, "float16", "soft")))` then `assert check_case(case).passed`.
"""
from __future__ import annotations

from .cases import (
           TOLERANCES,
           Case,
           Inputs,
           Setup,
           Tolerance,
           cases,
           inputs_for,
           make_case,
           make_inputs,
           make_params,
           params_for,
           shapes,
)
from .check import CaseReport, Comparison, Report, check_case, check_spec

__all__ = ["TOLERANCES", "Tolerance", "Setup", "Inputs", "Case", "Comparison", "CaseReport", "Report",
           "shapes", "params_for", "inputs_for", "cases", "make_params", "make_inputs", "make_case",
           "check_case", "check_spec"]
