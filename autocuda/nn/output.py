"""A layer's output per step, where its spec names one (`output`, docs/spec-format.md): the spike (the default),
a state after the step (a non-spiking neuron's membrane), or an expression of x, the spike, the states after the
step and the parameters (LIAF's analog output). The kernels run the spec as always; the output is read or
computed from their spike and state sequences with torch after the kernel, as FlexSN's outputs are
(`spec.step.Output`), so that autograd carries its gradient into the kernels' backward through those
sequences. A plain name needs no sympy; only an expression is parsed (once per spec) and evaluated.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..spec.model import SPIKE_OUTPUT, NeuronSpec
from ..spec.step import EXPRESSION, SPIKE, STATE, Output

__all__ = ["spec_output", "layer_output"]


def spec_output(spec: NeuronSpec) -> Output:
    """What the layer returns: the spike, a state (by name) or an expression (its text)."""
    text = spec.output.strip()
    if text == SPIKE_OUTPUT:
        return Output(SPIKE)
    if text in {s.name for s in spec.states}:
        return Output(STATE, state=text)
    return Output(EXPRESSION, expr=text)


@functools.lru_cache(maxsize=64)
def _expression(spec: NeuronSpec) -> Any:
    parsed = spec.parsed()
    return parsed, parsed.expand(parsed.output)


def layer_output(spec: NeuronSpec, output: Output, inputs: torch.Tensor | Sequence[torch.Tensor],
                 spike: torch.Tensor, after: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> torch.Tensor:
    """The output of a step (or of a sequence: inputs, spike and the states as [T, *] sequences) from the step
    inputs (x, or one tensor per input of a spec with several), the states after it, by name, and the parameters
    (v_reset=None, a soft reset, reads as 0 as in the charge)."""
    if output.kind == SPIKE:
        return spike
    if output.kind == STATE:
        return after[output.state]
    from ..spec.torch_eval import evaluate  # sympy: only for outputs that are expressions

    parsed, expr = _expression(spec)
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    x = inputs[0]
    values = {**dict(zip(parsed.inputs, inputs)), parsed.s: spike,
              **{symbol: after[name] for name, symbol in parsed.state_symbols.items()},
              **{symbol: 0.0 if params[name] is None else params[name]
                 for name, symbol in parsed.param_symbols.items()}}
    return evaluate(expr, values).to(x.dtype).expand(x.shape)
