"""Transforms of a spec into another spec.

`with_input_affine(spec)`: the same neuron whose input is `in_scale * x + in_shift`, with `in_scale` and
`in_shift` two learnable tensor parameters (one value per neuron, or broadcast). A normalisation layer
before the neuron (BatchNorm: `a_c * x + b_c` per channel) then runs inside the neuron's kernels, which read
x once instead of the normalised copy a separate layer writes.

The input symbol is replaced in the expression's Python syntax tree, never in its text (a name that merely
contains `x`, such as `x0` or `tau_x`, is another name); the new text goes through the spec's own parser,
as every expression does.
"""
from __future__ import annotations

import ast
import dataclasses

from ..base.errors import SpecError
from .model import NeuronSpec, Param
from .names import MAX_SPEC_NAME

__all__ = ["INPUT_SCALE", "INPUT_SHIFT", "with_input_affine"]

INPUT_SCALE, INPUT_SHIFT = "in_scale", "in_shift"
INPUT = "x"
SUFFIX = "_affine"


class _Input(ast.NodeTransformer):
    """Every load of the input name becomes `(in_scale * x + in_shift)`."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id != INPUT:
            return node
        scaled = ast.BinOp(ast.Name(INPUT_SCALE, ast.Load()), ast.Mult(), ast.Name(INPUT, ast.Load()))
        return ast.BinOp(scaled, ast.Add(), ast.Name(INPUT_SHIFT, ast.Load()))


def affine_text(text: str, field: str, source: str = "<python>") -> str:
    """`text` with the input replaced by `in_scale * x + in_shift` (SpecError naming `field` if it is no
    Python expression; the spec's parser checks the rest)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise SpecError(f"not an expression: {error}", source=source, field=field) from None
    return ast.unparse(ast.fix_missing_locations(_Input().visit(tree)))


def _affine_pairs(pairs: tuple[tuple[str, str], ...], field: str, source: str) -> tuple[tuple[str, str], ...]:
    return tuple((name, affine_text(text, f"{field}.{name}", source)) for name, text in pairs)


def with_input_affine(spec: NeuronSpec) -> NeuronSpec:
    """`spec` with its input x replaced by `in_scale * x + in_shift` in the charge, the updates, the ODE and the
    jumps (the fields that may read x: model.py); `in_scale` (default 1) and `in_shift` (default 0) are
    learnable tensor parameters appended to the spec's. Refuses a spec that already has a name called so."""
    if not isinstance(spec, NeuronSpec):
        raise TypeError(f"spec: expected a NeuronSpec, got {type(spec).__name__}")
    taken = {p.name for p in spec.params} | {s.name for s in spec.states} | {n for n, _ in spec.derived} \
        | {n for n, _ in spec.options}
    for name in (INPUT_SCALE, INPUT_SHIFT):
        if name in taken:
            raise SpecError(f"spec {spec.name!r} already has a name {name!r}: with_input_affine adds a parameter "
                            f"of that name (rename yours)", source=spec.origin, field=f"params.{name}", symbol=name)
    params = (*spec.params,
              Param(INPUT_SCALE, 1.0, kind="tensor", learnable=True, doc="scale of the input (per neuron)"),
              Param(INPUT_SHIFT, 0.0, kind="tensor", learnable=True, doc="shift of the input (per neuron)"))
    # the charge is unused (may be empty) when the membrane has an ODE
    charge = affine_text(spec.charge, "charge", spec.origin) if spec.charge.strip() else spec.charge
    name = spec.name[:MAX_SPEC_NAME - len(SUFFIX)].rstrip("_") + SUFFIX
    doc = f"{spec.doc} (input: in_scale * x + in_shift)" if spec.doc else "input: in_scale * x + in_shift"
    return dataclasses.replace(spec, name=name, doc=doc, params=params, charge=charge,
                               updates=_affine_pairs(spec.updates, "updates", spec.origin),
                               ode=_affine_pairs(spec.ode, "ode", spec.origin),
                               jumps=_affine_pairs(spec.jumps, "jumps", spec.origin))
