"""A traced step function as a spec, and how its arguments and returns map onto the spec's (sympy-free).

`StepSpec` is what `spec.python.from_trace` builds from a `spec.trace.Trace`; it round-trips through JSON so
that a layer can keep it on disk (`autocuda.nn.flexsn`): a process that finds it there never imports sympy.

Step inputs: a step with one input reads it as the spec's x, whatever the function calls it (its kernels are
those of the TOML spec that writes x); a step with several has them as the spec's `inputs`, named as the
function names them (respelled where the spec language needs it), each a sequence the kernels read with its
own gradient. No input is combined with torch before the kernel: the kernels read every input where the step
does, which costs no extra pass over the sequences and keeps one path for every step.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ..base.errors import SpecError
from .model import RESERVED, TAKEN_INPUT_NAMES, NeuronSpec, Param, State
from .names import name_problem, spec_name_problem
from .surrogate import Surrogate, get_surrogate
from .trace import Trace, signature_names, trace

__all__ = ["Output", "StepSpec", "SPIKE", "STATE", "EXPRESSION", "prepare", "input_names", "spec_names",
           "clean_spec_name"]

OutputKind = Literal["spike", "state", "expression"]
SPIKE: OutputKind = "spike"
STATE: OutputKind = "state"
EXPRESSION: OutputKind = "expression"


@dataclasses.dataclass(frozen=True)
class Output:
    """One non-state return value of a step: the spike, a new state (by name), or an expression (text of the
    spec language over x, the states before the step, the parameters and s)."""

    kind: OutputKind
    state: str = ""
    expr: str = ""


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """A step function as a spec, and how its arguments and returns map onto the spec's."""

    spec: NeuronSpec          # its `inputs` are the step's inputs, in the step's order
    states: tuple[str, ...]   # the step's states, in the step's order, by their spec names
    params: tuple[str, ...]   # the step's parameters, in the step's order, by their spec names
    outputs: tuple[Output, ...]
    detach_reset: bool
    spiking: bool             # False: the step has no spike (its spec never fires)

    @property
    def num_inputs(self) -> int:
        return len(self.spec.inputs)

    @property
    def surrogate(self) -> Surrogate | None:
        return self.spec.surrogate if self.spiking else None

    def to_json(self) -> str:
        s = self.spec
        surrogate = {"name": s.surrogate.name, **s.surrogate._init_kwargs()}
        spec = {"name": s.name, "doc": s.doc, "charge": s.charge, "threshold": s.threshold, "reset": s.reset,
                "params": [dataclasses.asdict(p) for p in s.params], "states": [[t.name, t.init] for t in s.states],
                "updates": [list(u) for u in s.updates], "surrogate": surrogate, "inputs": list(s.inputs),
                "fires_at": s.fires_at, "origin": s.origin}
        return json.dumps({"spec": spec, "states": self.states, "params": self.params,
                           "outputs": [dataclasses.astuple(o) for o in self.outputs],
                           "detach_reset": self.detach_reset, "spiking": self.spiking})

    @staticmethod
    def from_json(text: str) -> StepSpec:
        data = json.loads(text)
        spec = dict(data["spec"])
        spec["params"] = tuple(Param(**p) for p in spec["params"])
        spec["states"] = tuple(State(n, i) for n, i in spec["states"])
        spec["updates"] = tuple(tuple(u) for u in spec["updates"])
        spec["surrogate"] = get_surrogate(spec["surrogate"])
        spec["inputs"] = tuple(spec["inputs"])
        return StepSpec(NeuronSpec(**spec), tuple(data["states"]), tuple(data["params"]),
                        tuple(Output(*o) for o in data["outputs"]), bool(data["detach_reset"]),
                        bool(data["spiking"]))


def spec_names(names: Sequence[str], taken: set[str], fallback: str) -> list[str]:
    """Each name as the spec may spell it (x, h, s and the language's names are taken)."""
    result = []
    for i, name in enumerate(names):
        candidate = name
        if name_problem(candidate) is not None or candidate in taken:
            candidate = f"{name}_{fallback}" if name_problem(f"{name}_{fallback}") is None else f"{fallback}{i}"
        while candidate in taken:
            candidate += "_"
        taken.add(candidate)
        result.append(candidate)
    return result


def clean_spec_name(name: str) -> str:
    """`name` as a spec's name (kernel names are made from it)."""
    if spec_name_problem(name) is None:
        return name
    cleaned = "_".join(p for p in "".join(c if c.isalnum() else "_" for c in name).split("_") if p)
    return cleaned if cleaned and spec_name_problem(cleaned) is None else "python_neuron"


def input_names(names: Sequence[str]) -> list[str]:
    """The spec's names of a step's inputs (the function's names, `names`): x for one (see the module doc), the
    function's own names for several, respelled where the spec language or a kernel argument needs it."""
    if len(names) == 1:
        return ["x"]
    return spec_names(names, {*RESERVED, *TAKEN_INPUT_NAMES} - {"x"}, "input")


def prepare(fn: Callable[..., Any], states: Sequence[str], params: Sequence[Param], *, num_inputs: int = 1,
            origin: str = "<python>", dtype: torch.dtype = torch.float32
            ) -> tuple[Trace, list[str], list[str], list[Param]]:
    """Trace `fn(*inputs, *states, *params)` under the spec's spelling of the names: (trace, inputs, states,
    params); the first `num_inputs` positional arguments are the step inputs."""
    if num_inputs < 1:
        raise SpecError(f"{getattr(fn, '__name__', 'the step')} takes no step input", source=origin,
                        symbol="inputs")
    positional = [p.name for p in signature_names(fn)]
    if len(positional) < num_inputs + len(states) + len(params):
        raise SpecError(f"{getattr(fn, '__name__', 'the step')} takes {len(positional)} positional arguments, "
                        f"fewer than its {num_inputs} input(s), {len(states)} state(s) and {len(params)} "
                        f"parameter(s)", source=origin, symbol="inputs")
    inputs = input_names(positional[:num_inputs])
    taken = {*RESERVED, *inputs}
    state_names = spec_names(states, taken, "state")
    param_names = spec_names([p.name for p in params], taken, "param")
    spec_params = [dataclasses.replace(p, name=n) for p, n in zip(params, param_names)]
    traced = trace(fn, [*inputs, *state_names, *param_names], dtype=dtype)
    if len(traced.returns) < len(state_names):
        raise SpecError(f"{traced.name} returned {len(traced.returns)} values, fewer than its "
                        f"{len(state_names)} states", source=origin, symbol="returns")
    return traced, inputs, state_names, spec_params
