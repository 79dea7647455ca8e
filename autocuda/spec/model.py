"""The neuron spec: a frozen, hashable description of one spiking neuron, from Python or from a TOML file.

TOML format (one file per neuron; unknown keys anywhere are errors, so typos do not pass silently)::

    name = "izhikevich"                   # optional, defaults to the file stem
    doc = "Izhikevich neuron (quadratic membrane with a recovery current)"
    charge = "v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau"     # h = f(x, states, params, derived)
    threshold = "v_threshold"             # optional (this default); states, params, derived
    reset = "hard"                        # hard (needs param v_reset) | soft | none; optional, default hard
    fires_at = ">="                       # optional (this default): s = 1 where h >= threshold; ">": only where
                                          # h > threshold (NIR, snnTorch, Norse); it applies to every level too
    detach_reset = false                  # optional (this default): true: the reset sees the spike detached (no
                                          # gradient through it, SpikingJelly's detach_reset) in every layer

    [params]                              # in declaration order
    tau = 2.0                             # a plain number: runtime scalar with this default
    a0 = { default = 1.0, kind = "constant" }           # baked into the kernel source as a literal
    w_scale = { default = 0.0, kind = "tensor", learnable = true, doc = "..." }

    [states]                              # the FIRST state is the membrane potential (conventionally v)
    v = "v_reset"                         # initial value: a number or a parameter name
    w = 0.0

    [updates]                             # every non-membrane state, after firing; may use x, h, s
    w = "w + (a * (h - v_rest) - w) / tau_w + b * s"

    [derived]                             # named quantities of params and earlier derived ones, in order
    decay = "sigmoid(w)"

    [options]                             # compile-time booleans, used only as `A if opt else B`
    decay_input = true

    output = "v"                          # optional, default "s": the layer's output at each step, an expression
                                          # of x, s, the states *after* the step and the parameters (the spike
                                          # by default; the membrane for a non-spiking neuron)

    [surrogate]                           # optional, default Sigmoid(alpha=4)
    name = "Sigmoid"
    alpha = 4.0                           # or: gradient = "1 / (1 + abs(x))**2" plus its own parameters

The comparison `fires_at` chooses the step Θ: with ">=" (the default) Θ(z) = 1 for z >= 0, so h landing exactly on
the threshold fires; with ">" Θ(z) = 1 for z > 0 only (Θ(0) = 0). Only the forward value differs: the surrogate
gradient is the same.

Multi-level spikes (optional; without them s = Θ(h - threshold)): s = Σ_k weight_k Θ(argument_k), each level
with its own surrogate (default: the neuron's, [surrogate] or the layer's choice). The soft reset subtracts
s · threshold; the hard reset sees the event Σ_k |weight_k| Θ(argument_k) (levels that fire one at a time).
Example (ternary_if)::

    [[levels]]
    argument = "h - v_threshold"          # an expression of h, the states and the parameters; fires at >= 0
                                          # (at > 0 under fires_at = ">")
    weight = 1.0                          # optional, default 1; a nonzero number
    [[levels]]
    argument = "-h - v_threshold"
    weight = -1.0
    surrogate = { name = "ATan" }         # optional: this level's own surrogate

Continuous form (docs/ode.md): `[ode]` gives d(state)/dt instead of `charge` (for the membrane) or an update
(for another state); x and the states without an ODE are constant over a step of length `time_step` (a
parameter, added as a runtime scalar 1.0 when not declared; it must be positive). Example (sfa_lif)::

    method = "exact"                      # optional: euler | exponential_euler | exact; default: the best one
                                          # the system allows (exact, then exponential_euler, then euler)
    [ode]
    v = "(-(v - v_rest) + R * x - w) / tau"
    w = "-w / tau_w"

    [jumps]                               # after a spike (s = 1), an ODE state takes this value:
    w = "w + b"                           # w' = w_int + s * (jump - w_int); names in it are values at the end of
                                          # the integration (the membrane's is h, before reset)

The step each method produces is in `autocuda.spec.ode`; the result is the same `charge` and `updates` a
discrete spec has (`ParsedSpec.method` says which method was used).

Param kinds: 'constant' (a literal in the source), 'scalar' (runtime float, by value), 'tensor' (runtime tensor
broadcast over neurons). `learnable = true` means a tensor: with no kind given it becomes 'tensor'; a
learnable 'constant' or 'scalar' is an error. Reserved expression names: x (input), h (charge result) and
s (spike); h and s exist only in updates (s also in output).

Several step inputs (optional; default `inputs = ["x"]`): `inputs = ["g_e", "g_i"]` names them; each is a
sequence the kernels read, usable wherever x is, and backward returns a gradient for each. Their names are
taken like x: no parameter, state, derived quantity or option may reuse one.
Reset is applied by the derivation stage, not here.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from ..base.errors import SpecError
from ..base.lazy import lazy_import
from . import budget, hooks, parts
from .names import check_identifier, spec_name_problem
from .ode import METHODS, TIME_STEP, discretise, with_jump
from .parsed import SPIKE_OUTPUT, ParsedSpec
from .parts import Kind, Level, Param, State
from .surrogate import Sigmoid, Surrogate, get_surrogate

if TYPE_CHECKING:
    import sympy
else:
    sympy = lazy_import("sympy")

__all__ = ["Kind", "Param", "State", "Level", "NeuronSpec", "parse_spec", "reset_rules", "FIRES_AT"]

Reset = Literal["hard", "soft", "none"]
RESETS: tuple[Reset, ...] = ("hard", "soft", "none")
FiresAt = Literal[">=", ">"]  # the spike's comparison of h with the threshold (of each level's argument with 0)
FIRES_AT: tuple[FiresAt, ...] = (">=", ">")
RESERVED = {"x": "the input", "h": "the charge result", "s": "the spike"}
DEFAULT_INPUTS = ("x",)  # one step input, x
# Input names that would make a kernel argument's key another argument's (`<input>_seq`, `grad_<input>_seq`)
TAKEN_INPUT_NAMES = {"h": "the charge result (h_seq)", "s": "the spike", "spike": "the spike (spike_seq)"}


@dataclasses.dataclass(frozen=True)
class NeuronSpec:
    """A spiking neuron: params, states, charge, threshold, reset, updates, surrogate (see module doc)."""

    name: str
    doc: str = ""
    params: tuple[Param, ...] = ()
    states: tuple[State, ...] = ()
    charge: str = ""
    threshold: str = "v_threshold"
    reset: Reset = "hard"
    updates: tuple[tuple[str, str], ...] = ()
    derived: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, bool], ...] = ()
    surrogate: Surrogate = Sigmoid()
    ode: tuple[tuple[str, str], ...] = ()  # state -> d(state)/dt (see docs/ode.md)
    jumps: tuple[tuple[str, str], ...] = ()  # ODE state -> its value after a spike
    method: str | None = None  # euler | exponential_euler | exact; None: chosen from the ODE's form
    output: str = SPIKE_OUTPUT  # the layer's output per step (see module doc)
    levels: tuple[Level, ...] | None = None  # a multi-level spike; None: s = Θ(h - threshold)
    inputs: tuple[str, ...] = DEFAULT_INPUTS  # the step inputs' names, each a sequence the kernels read
    fires_at: FiresAt = ">="  # the spike's comparison: ">=" fires where h equals the threshold, ">" does not
    # The reset sees the spike detached (SpikingJelly's detach_reset; `s.detach()` in a Python step's reset): every
    # layer and call of the spec detaches it, whatever its own detach_reset (which can only add the detachment)
    detach_reset: bool = False
    # The forward kernels write the output in place of the spike (inference only: nn.output's variant for calls
    # that take no gradient; no backward kernel is made of such a spec)
    writes_output: bool = False
    origin: str = dataclasses.field(default="<python>", compare=False)  # file it came from, for errors

    def __post_init__(self) -> None:
        try:
            self._normalise()
            self._validate()  # always: cheap and sympy-free, and what keeps names and structure sound
            # Parsing needs sympy, which a process whose kernels are all cached never imports: a spec whose text
            # parsed before (the installed parse cache knows it) is parsed only when asked to.
            text = spec_text(self)
            if not hooks.parsed_before(text):
                object.__setattr__(self, "_parsed", parse_spec(self))
                hooks.remember_parsed(text)
        except SpecError as err:
            raise (err.with_source(self.origin) if err.source == "<python>" else err) from None

    def _normalise(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("params", parts.normalise_params(self.params))
        set_("states", parts.normalise_states(self.states))
        set_("updates", parts.text_pairs(self.updates, "updates"))
        set_("derived", parts.text_pairs(self.derived, "derived"))
        set_("options", tuple((n, parts.expect(v, bool, f"options.{n}", "true or false"))
                              for n, v in parts.pairs(self.options, "options")))
        set_("surrogate", get_surrogate(self.surrogate).frozen())  # a user's later change must not alter the spec
        set_("ode", parts.text_pairs(self.ode, "ode"))
        set_("jumps", parts.text_pairs(self.jumps, "jumps"))
        if self.method is not None:
            parts.expect(self.method, str, "method", "a method name")
        parts.expect(self.output, str, "output", "an expression string")
        set_("levels", parts.normalise_levels(self.levels))
        set_("inputs", parts.normalise_inputs(self.inputs))
        if self.ode and all(p.name != TIME_STEP for p in self.params):
            set_("params", (*self.params, Param(TIME_STEP, 1.0, doc="integration time step dt of [ode]")))

    def _validate(self) -> None:
        parts.expect(self.name, str, "name", "a string")
        problem = spec_name_problem(self.name)
        if problem is not None:
            raise SpecError(problem, field="name", symbol=self.name)
        parts.expect(self.doc, str, "doc", "a string")
        parts.expect(self.origin, str, "origin", "a string")
        if self.reset not in RESETS:
            raise SpecError(f"reset must be one of {', '.join(RESETS)}", field="reset", symbol=str(self.reset))
        parts.expect(self.detach_reset, bool, "detach_reset", "true or false")
        if not isinstance(self.fires_at, str) or self.fires_at not in FIRES_AT:
            raise SpecError(f"fires_at must be one of {', '.join(repr(c) for c in FIRES_AT)}, got {self.fires_at!r}",
                            field="fires_at", symbol=str(self.fires_at))
        self._check_names()
        self._check_structure()

    def _check_names(self) -> None:
        seen: dict[str, str] = {}
        groups = {"params": [p.name for p in self.params], "states": [s.name for s in self.states],
                  "derived": [n for n, _ in self.derived], "options": [n for n, _ in self.options]}
        for index, name in enumerate(self.inputs):
            field = f"inputs[{index}]"
            check_identifier(name, field=field)
            if name in TAKEN_INPUT_NAMES:
                raise SpecError(f"'{name}' cannot name an input: it is {TAKEN_INPUT_NAMES[name]}", field=field,
                                symbol=name)
            if name in seen:
                raise SpecError(f"input '{name}' is declared twice", field=field, symbol=name)
            seen[name] = "inputs"
        for group, names in groups.items():
            for name in names:
                field = f"{group}.{name}"
                check_identifier(name, field=field)
                if name in RESERVED:
                    raise SpecError(f"'{name}' is reserved for {RESERVED[name]}", field=field, symbol=name)
                if name == "dt":  # it would read as the time step, and be another parameter
                    raise SpecError(f"'dt' is not the time step: the time step of [ode] is the parameter "
                                    f"'{TIME_STEP}'", field=field, symbol=name)
                if name in seen:
                    raise SpecError(f"'{name}' is declared twice (also in {seen[name]})", field=field, symbol=name)
                seen[name] = group

    def _check_structure(self) -> None:
        if not self.states:
            raise SpecError("at least one state (the membrane potential) is required", field="states")
        params = {p.name for p in self.params}
        if self.reset == "hard" and "v_reset" not in params:
            raise SpecError("hard reset needs a parameter 'v_reset'", field="reset", symbol="v_reset")
        for state in self.states:
            if isinstance(state.init, str) and state.init not in params:
                raise SpecError(f"initial value {state.init!r} is not a parameter", field=f"states.{state.name}",
                                symbol=state.init)
        _check_ode_structure(self)
        membrane, others = self.states[0].name, [s.name for s in self.states[1:]]
        for name, _ in self.updates:
            if name == membrane:
                raise SpecError(f"the membrane '{name}' is set by charge and reset, not by an update",
                                field=f"updates.{name}", symbol=name)
            if name not in others:
                raise SpecError(f"'{name}' is not a state", field=f"updates.{name}", symbol=name)
        missing = [n for n in others if n not in dict(self.updates) and n not in dict(self.ode)]
        if missing:
            raise SpecError(f"state '{missing[0]}' needs an update", field=f"updates.{missing[0]}", symbol=missing[0])
        if len(dict(self.updates)) != len(self.updates):
            raise SpecError("a state is updated twice", field="updates")

    def parsed(self) -> ParsedSpec:
        """The spec's expressions as sympy (built once, at construction or after unpickling)."""
        if "_parsed" not in self.__dict__:
            object.__setattr__(self, "_parsed", parse_spec(self))
        parsed: ParsedSpec = self.__dict__["_parsed"]
        budget.reuse(parsed)  # a stage that builds on the parse counts its CPU time (spec.budget)
        return parsed

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_parsed"}  # cheap to rebuild, big to ship

    @property
    def membrane(self) -> str:
        return self.states[0].name

    def with_options(self, **options: bool) -> NeuronSpec:
        """The same neuron with some compile-time options changed."""
        unknown = set(options) - {n for n, _ in self.options}
        if unknown:
            known = ", ".join(n for n, _ in self.options) or "none"
            raise SpecError(f"unknown option {sorted(unknown)[0]!r} (options of {self.name!r}: {known})",
                            source=self.origin, field="options")
        merged = tuple((n, options.get(n, v)) for n, v in self.options)
        return dataclasses.replace(self, options=merged)

    def source(self, kernel: str = "fptt", dtype: Any = "float32", **options: Any) -> str:
        """Readable CUDA source of one generated kernel: 'fptt', 'bptt', 'step-forward' or 'step-backward',
        dtype by its torch name; options as `autocuda.neuron_kernel` (reset, detach_reset, ...)."""
        return hooks.kernel_source(self, kernel, dtype, **options)

    def with_defaults(self, **defaults: float) -> NeuronSpec:
        """The same neuron with some parameter defaults changed."""
        unknown = set(defaults) - {p.name for p in self.params}
        if unknown:
            raise SpecError(f"unknown parameter {sorted(unknown)[0]!r}", source=self.origin, field="params")
        params = tuple(dataclasses.replace(p, default=defaults.get(p.name, p.default)) for p in self.params)
        return dataclasses.replace(self, params=params)


# -- structure of a spec with [ode] ------------------------------------------------------------------------------
def _check_ode_structure(spec: NeuronSpec) -> None:
    """Which state is set by what: charge or ODE for the membrane, update or ODE for the others; jumps, method
    and time step. Raises SpecError naming the field and symbol."""
    ode, updates, states = dict(spec.ode), dict(spec.updates), [s.name for s in spec.states]
    if not ode:
        if spec.method is not None:
            raise SpecError("'method' integrates [ode] dynamics; this spec has no [ode]", field="method",
                            symbol=str(spec.method))
        for name, _ in spec.jumps:
            raise SpecError("[jumps] act on states with an ODE; without [ode] write the spike's effect in "
                            "[updates] (it may use s)", field=f"jumps.{name}", symbol=name)
        return
    if spec.method is not None and spec.method not in METHODS:
        raise SpecError(f"unknown method {spec.method!r} (allowed: {', '.join(METHODS)})", field="method",
                        symbol=str(spec.method))
    for name in ode:
        if name not in states:
            raise SpecError(f"'{name}' is not a state (states: {', '.join(states)})", field=f"ode.{name}",
                            symbol=name)
        if name in updates:
            raise SpecError(f"'{name}' has both an ODE and an update; keep one (an ODE state's spike effect goes "
                            "in [jumps])", field=f"updates.{name}", symbol=name)
    if spec.membrane in ode and spec.charge:
        raise SpecError(f"the membrane '{spec.membrane}' has both 'charge' and an ODE; keep one",
                        field=f"ode.{spec.membrane}", symbol=spec.membrane)
    if spec.membrane not in ode and not spec.charge:
        raise SpecError(f"missing 'charge' (or an [ode] entry for the membrane '{spec.membrane}')", field="charge")
    _check_jumps(spec, ode)
    step = next(p for p in spec.params if p.name == TIME_STEP)
    if step.default <= 0:
        raise SpecError(f"the time step must be positive, got {step.default:g}", field=f"params.{TIME_STEP}",
                        symbol=TIME_STEP)


def _check_jumps(spec: NeuronSpec, ode: Mapping[str, str]) -> None:
    if len(dict(spec.jumps)) != len(spec.jumps):
        raise SpecError("a state jumps twice", field="jumps")
    for name, _ in spec.jumps:
        if name == spec.membrane:
            raise SpecError(f"the membrane '{name}' is reset by 'reset', not by a jump", field=f"jumps.{name}",
                            symbol=name)
        if name not in ode:
            raise SpecError(f"'{name}' has no ODE: jumps act on ODE states (an update may use s instead)",
                            field=f"jumps.{name}", symbol=name)


def tensor_param_names(spec: NeuronSpec) -> tuple[str, ...]:
    return tuple(p.name for p in spec.params if p.kind == "tensor")


def runtime_params(spec: NeuronSpec, reset: str) -> tuple[str, ...]:
    """Parameters passed at run time (scalars and tensors); v_reset only matters under a hard reset."""
    return tuple(p.name for p in spec.params
                 if p.kind != "constant" and not (p.name == "v_reset" and reset != "hard"))


def reset_rules(spec: NeuronSpec) -> tuple[Reset, ...]:
    """The reset rules `spec`'s kernels can take: its own first, then the others (hard needs v_reset)."""
    hard = any(p.name == "v_reset" for p in spec.params)
    return tuple(dict.fromkeys(r for r in (spec.reset, *RESETS) if r != "hard" or hard))


def check_reset(spec: NeuronSpec, reset: str) -> Reset:
    """`reset` as a reset rule of `spec`; SpecError for an unknown one, or a hard reset in a spec without v_reset."""
    known = next((rule for rule in RESETS if rule == reset), None)
    if known is None:
        raise SpecError(f"reset must be one of {', '.join(RESETS)}", source=spec.origin, field="reset",
                        symbol=str(reset))
    if known == "hard" and all(p.name != "v_reset" for p in spec.params):
        raise SpecError("hard reset needs a parameter 'v_reset'", source=spec.origin, field="reset")
    return known


def spec_text(spec: NeuronSpec) -> str:
    """Everything that defines a spec (not where it was loaded from), as stable text. The output is left out
    where it is the spike, the levels where there are none, the inputs where there is x alone, the comparison
    where it is ">=", `detach_reset` and `writes_output` where they are off: the specs that had none of these fields
    keep their text (and so their cache entries)."""
    defaults = {"output": SPIKE_OUTPUT, "levels": None, "inputs": DEFAULT_INPUTS, "fires_at": ">=",
                "detach_reset": False, "writes_output": False}
    return repr(tuple((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec)
                      if f.name != "origin" and not (f.name in defaults and getattr(spec, f.name) == defaults[f.name])))


# -- parsing: the spec's expressions in sympy form (`ParsedSpec`) --------------------------------------------
def _symbols(names: Any) -> dict[str, sympy.Symbol]:
    return {n: sympy.Symbol(n, real=True) for n in names}


def parse_spec(spec: NeuronSpec) -> ParsedSpec:
    """`spec`'s expressions in sympy form, parsed within the parse stage's time budget."""
    return budget.bounded(spec.origin, "charge", _parse_spec_expressions, spec)


def _parse_spec_expressions(spec: NeuronSpec) -> ParsedSpec:
    from .draws import renumbered
    from .parse import parse_expression

    h, s = (sympy.Symbol(n, real=True) for n in ("h", "s"))
    inputs = _symbols(spec.inputs)
    x = next(iter(inputs.values()))
    params = _symbols(p.name for p in spec.params)
    states = _symbols(st.name for st in spec.states)
    options = dict(spec.options)

    sites = 0  # draws parsed so far: each call of randn() or rand() is a site of its own (`spec.draws`)

    def parse(text: str, symbols: Mapping[str, sympy.Symbol], field: str, draws: bool = False) -> sympy.Expr:
        nonlocal sites
        try:
            parsed = parse_expression(text, symbols, source=spec.origin, field=field, options=options, draws=draws)
            parsed, count = renumbered(parsed, sites)
            sites += count
            return parsed
        except SpecError as err:
            if err.symbol in ("h", "s") and field in ("charge", "threshold"):
                raise SpecError(f"{err.message}; 'h' and 's' exist only in updates", source=err.source,
                                field=err.field, symbol=err.symbol) from None
            raise

    derived_symbols: dict[str, sympy.Symbol] = {}
    derived: dict[str, sympy.Expr] = {}
    values: dict[str, sympy.Expr] = {}
    for name, text in spec.derived:
        derived[name] = parse(text, {**params, **derived_symbols}, f"derived.{name}")
        values[name] = budget.substituted(derived[name], {derived_symbols[n]: v for n, v in values.items()},
                                          source=spec.origin, field=f"derived.{name}", what="derived values")
        derived_symbols[name] = sympy.Symbol(name, real=True)
    known = {**states, **params, **derived_symbols}
    rhs = {n: parse(t, {**inputs, **known}, f"ode.{n}") for n, t in spec.ode}
    charge = None if spec.membrane in rhs else parse(spec.charge, {**inputs, **known}, "charge", draws=True)
    threshold = parse(spec.threshold, known, "threshold")
    updates = {n: parse(t, {**inputs, "h": h, "s": s, **known}, f"updates.{n}", draws=True) for n, t in spec.updates}
    output = parse(spec.output, {**inputs, "s": s, **known}, "output") if spec.output != SPIKE_OUTPUT else None
    levels = tuple(parse(lv.argument, {"h": h, **known}, f"levels[{i}].argument")
                   for i, lv in enumerate(spec.levels or ()))
    method = None
    if rhs:  # continuous dynamics: their discrete step gives the charge and/or updates (docs/ode.md)
        jumps = {n: parse(t, {**inputs, "h": h, **known}, f"jumps.{n}") for n, t in spec.jumps}
        with budget.working_on("method" if spec.method else "ode"):
            method, integrated = _integrate(spec, rhs, jumps, states, params[TIME_STEP], h, s)
        charge = integrated.pop(spec.membrane, charge)
        updates |= integrated
    ro = MappingProxyType
    return ParsedSpec(x, h, s, ro(params), ro(states), ro(derived_symbols), ro(derived), ro(values), charge,
                      threshold, ro(updates), method, ro(rhs), output, levels, tuple(inputs.values()))


def _integrate(spec: NeuronSpec, rhs: Mapping[str, sympy.Expr], jumps: Mapping[str, sympy.Expr],
               states: Mapping[str, sympy.Symbol], dt: sympy.Symbol, h: sympy.Symbol, s: sympy.Symbol
               ) -> tuple[str, dict[str, sympy.Expr]]:
    """The ODE states' values after one step (docs/ode.md), after-spike jumps applied."""
    step = discretise({states[n]: f for n, f in rhs.items()}, dt, spec.method)
    if step.note is not None:
        warnings.warn(f"{spec.origin}: spec {spec.name!r}: {step.note}", stacklevel=5)
    values = {u.name: e for u, e in step.values.items()}
    at_end = {states[n]: e for n, e in values.items()}
    at_end[states[spec.membrane]] = h  # in a jump the membrane is h (before reset), whether ODE or charge
    for name, jump in jumps.items():
        values[name] = with_jump(values[name], jump.xreplace(at_end), s)
    return step.method, values
