"""A layer's output per step, where its spec names one (`output`, docs/spec-format.md): the spike (the default),
a state after the step (a non-spiking neuron's membrane), or an expression of x, the spike, the states after the
step and the parameters (LIAF's analog output). Where a call takes a gradient, the kernels run the spec as
always and the output is read or computed from their spike and state sequences with torch after the kernel, as
FlexSN's outputs are (`spec.step.Output`), so that autograd carries its gradient into the kernels' backward through
those sequences; a multi-step call that takes none runs the spec's `writes_output` variant, whose kernels write the
output themselves (`nn.layer_call.writes_output`). A plain name needs no sympy; an expression is parsed and
lowered to a flat program (`spec.flat`) once, kept in the disk cache, and evaluated from it: a later process needs
no sympy for it either.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..spec import flat
from ..spec.model import SPIKE_OUTPUT, NeuronSpec, spec_text
from ..spec.step import EXPRESSION, SPIKE, STATE, Output
from ..toolchain import store

__all__ = ["spec_output", "output_program", "layer_output", "reads_states"]


def spec_output(spec: NeuronSpec) -> Output:
    """What the layer returns: the spike, a state (by name) or an expression (its text)."""
    text = spec.output.strip()
    if text == SPIKE_OUTPUT:
        return Output(SPIKE)
    if text in {s.name for s in spec.states}:
        return Output(STATE, state=text)
    return Output(EXPRESSION, expr=text)


KIND = "specs"  # the disk cache's folder of an output's flat program (beside FlexSN's)


def _names(spec: NeuronSpec) -> tuple[str, ...]:
    """The names an output may read: the step inputs, s, the states (after the step) and the parameters."""
    return (*spec.inputs, "s", *(s.name for s in spec.states), *(p.name for p in spec.params))


@functools.lru_cache(maxsize=64)
def _program(spec: NeuronSpec) -> flat.Program:
    """The spec's output expression (derived values expanded) as a flat program (`spec.flat`): from the disk cache
    (checked: `flat.check`), else parsed and lowered with sympy and stored, so that a later process evaluates the
    output without sympy."""
    key = store.key("layer output program " + spec_text(spec))
    cached = store.read(KIND, key)
    if cached is not None:
        try:
            return flat.from_json(cached, _names(spec))
        except ValueError:
            pass  # an entry this version did not write: lower the expression again
    from ..spec.torch_eval import lower  # sympy

    parsed = spec.parsed()
    program = lower(parsed.expand(parsed.output))
    store.save(KIND, key, flat.to_json(program))
    return program


def output_program(spec: NeuronSpec, output: Output) -> flat.Program | None:
    """An expression output's program (None for the spike or a state). Layers take it where they are built or
    their spec changes, not in a call: a call traced by torch.compile must read neither the disk cache nor sympy."""
    return _program(spec) if output.kind == EXPRESSION else None


def reads_states(spec: NeuronSpec, output: Output, program: flat.Program | None) -> bool:
    """Whether the output (with its `output_program`) reads a state after the step, so that a sequence's call
    must keep the state sequences: a state output does, the spike does not, an expression where its program
    (derived values expanded) names one."""
    if program is None:
        return output.kind == STATE
    return not flat.symbols_of(program).isdisjoint(s.name for s in spec.states)


def layer_output(spec: NeuronSpec, output: Output, inputs: torch.Tensor | Sequence[torch.Tensor],
                 spike: torch.Tensor, after: Mapping[str, torch.Tensor], params: Mapping[str, Any],
                 program: flat.Program | None = None) -> torch.Tensor:
    """The output of a step (or of a sequence: inputs, spike and the states as [T, *] sequences) from the step
    inputs (x, or one tensor per input of a spec with several), the states after it, by name (those it reads:
    `reads_states`), and the parameters; an expression by its `program` (`output_program`; found here where none
    is given). v_reset reads as 0 where the reset is not hard (v_reset=None, or a spec whose reset is soft or none),
    as the kernels read it in the charge (docs/semantics.md)."""
    if output.kind == SPIKE:
        return spike
    if output.kind == STATE:
        return after[output.state]
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    x = inputs[0]
    soft = spec.reset != "hard"
    values = {**dict(zip(spec.inputs, inputs)), "s": spike, **after,
              **{p.name: 0.0 if params[p.name] is None or (soft and p.name == "v_reset") else params[p.name]
                 for p in spec.params}}
    return flat.run(_program(spec) if program is None else program, values).to(x.dtype).expand(x.shape)
