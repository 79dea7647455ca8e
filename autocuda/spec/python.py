"""Neurons written in Python: a traced step function (`spec.trace`) -> the same `NeuronSpec` a TOML file gives.

A step returns `(*outputs, *new_states)`. Mapping it onto a spec (charge, threshold, reset, updates):

- the spike `s` is the surrogate's result, Θ(z) with z its argument (fires_at ">" where the surrogate's forward
  compares z > 0);
- the membrane is the first state whose new value is one of the spec's reset rules applied to a charge h (the
  new value with s = 0): `none` (no s in it), `soft` (h - s·threshold) or `hard` (h·(1 - s) + s·v_reset, with
  v_reset a parameter or a number); the threshold is h - z and may not depend on an input;
- every other state is an update (which may use the inputs, h, s and the states);
- a step that fits no rule (or has no spike) gets a spec of its own shape: one more state, the membrane
  `u` = z with threshold 0 and no reset, and every state of the step as an update; a step without a spike
  fires never (charge 0, threshold 1).

Outputs other than the spike and the new states are expressions of (the inputs, the states before the step,
the parameters, s), returned here for the caller to evaluate with torch after the kernel.

A step with several inputs (a conductance LIF, `g_e * (E_e - v) + g_i * (E_i - v)`) gives a spec with several
`inputs`, each read by the kernels (`spec.step` says how they are named).

`neuron` is the decorator for users: `@autocuda.neuron def lif(x, v, tau=2.0, v_threshold=1.0, v_reset=0.0)`
gives a NeuronSpec (the first argument is the input, or the first `num_inputs` arguments the inputs; arguments
without defaults the states, those with defaults the parameters).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch
from sympy.printing.str import StrPrinter

from ..base.errors import SpecError
from . import budget
from .draws import DRAW_FUNCTIONS, draw_symbol, draws_of
from .model import RESERVED, Kind, NeuronSpec, Param, State
from .names import name_problem, spec_name_problem
from .parse import FUNCTIONS, parse_expression
from .step import EXPRESSION, SPIKE, STATE, Output, StepSpec, clean_spec_name, input_names, prepare
from .surrogate import Sigmoid
from .trace import Trace, signature_names, step_name

__all__ = ["step_spec", "from_trace", "neuron", "expression_text", "load_python_spec"]


# ---- the traced table -> sympy ----

_RELATIONS = {"lt": sympy.StrictLessThan, "le": sympy.LessThan, "gt": sympy.StrictGreaterThan,
              "ge": sympy.GreaterThan}
_FUNCTIONS: Mapping[str, Callable[[sympy.Expr], sympy.Expr]] = {
    **{n: FUNCTIONS[n][2] for n in ("exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sigmoid", "erf")},
    "abs": sympy.Abs, "atan": sympy.atan}  # the expression language's builders: traced and written specs agree
S, DETACHED = sympy.Symbol("s", real=True), sympy.Dummy("s_detached", real=True)

# node operation -> its sympy, from the values of earlier nodes (v) and the node's operands
_NODES: Mapping[str, Callable[..., sympy.Basic]] = {
    "sym": lambda v, name: sympy.Symbol(name, real=True), "int": lambda v, n: sympy.Integer(n),
    "float": lambda v, f: sympy.Float(f), "spike": lambda v: S, "detached": lambda v: DETACHED,
    "add": lambda v, a, b: v[a] + v[b], "sub": lambda v, a, b: v[a] - v[b], "mul": lambda v, a, b: v[a] * v[b],
    "div": lambda v, a, b: v[a] / v[b], "pow": lambda v, a, b: sympy.Pow(v[a], v[b]), "neg": lambda v, a: -v[a],
    "min": lambda v, a, b: sympy.Min(v[a], v[b]), "max": lambda v, a, b: sympy.Max(v[a], v[b]),
    "fn": lambda v, name, a: _FUNCTIONS[name](v[a]), "heaviside": lambda v, a: FUNCTIONS["heaviside"][2](v[a]),
    "rel": lambda v, op, a, b: _RELATIONS[op](v[a], v[b]), "draw": lambda v, kind, k: draw_symbol(kind, k),
    "where": lambda v, rel, a, b: sympy.Piecewise((v[a], v[rel]), (v[b], True)),
    "ind": lambda v, rel: sympy.Piecewise((sympy.Integer(1), v[rel]), (sympy.Integer(0), True)),
}


def _sympy(traced: Trace, origin: str) -> list[sympy.Basic]:
    """Every node's value (a node refers to earlier nodes only), under the limits of a written spec
    (`spec.budget`): an exponent or an exp of a logarithm is checked before sympy evaluates the node, the
    node's value after."""
    values: list[sympy.Basic] = []
    for i, node in enumerate(traced.nodes):
        problem = _before(node, values)
        if problem is None:
            try:
                values.append(_NODES[node[0]](values, *node[1:]))
            except (ValueError, TypeError, ZeroDivisionError, OverflowError) as err:
                problem = f"invalid arithmetic in the step: {err}"
            else:
                problem = budget.check_node(values[-1])
        if problem is not None:
            raise _refused(traced, i, problem, origin)
    return values


def _before(node: tuple, values: Sequence[sympy.Basic]) -> str | None:
    if node[0] == "pow":
        return budget.check_exponent(values[node[2]])
    if node[0] == "fn" and node[1] == "exp":
        return budget.exp_problem(values[node[2]])
    return None


def _refused(traced: Trace, node: int, problem: str, origin: str) -> SpecError:
    """The refusal of a node, at the step's line that computed it (where the trace recorded one)."""
    where = traced.lines[node] if node < len(traced.lines) and traced.lines[node] else ""
    if not where:
        return SpecError(f"{traced.name}: {problem}", source=origin)
    file, _, line = where.rpartition(":")
    text = linecache.getline(file, int(line)).strip() if line.isdigit() else ""
    return SpecError(f"in {traced.name}(), `{text}`: {problem}", source=where)


# ---- sympy -> the expression language ----

def _join(op: str, parts: Sequence[str]) -> str:
    return "(" + f" {op} ".join(parts) + ")"


def _relation_text(rel: sympy.Basic) -> str:
    ops = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
           sympy.GreaterThan: ">="}
    op = ops.get(type(rel))
    if op is None:
        raise SpecError(f"the condition {rel} is not one comparison (<, <=, >, >=) of two values")
    return f"{expression_text(rel.lhs)} {op} {expression_text(rel.rhs)}"


def _piecewise_text(e: sympy.Piecewise) -> str:
    (value, cond), rest = e.args[0], e.args[1:]
    if cond == sympy.true:
        return expression_text(value)
    other = expression_text(sympy.Piecewise(*rest)) if rest else "0"
    return _choice_text(cond, expression_text(value), other)


def _choice_text(cond: sympy.Basic, then: str, other: str) -> str:
    """`then` where `cond` holds, else `other`, as where()s of one comparison each: sympy's conditions may be And,
    Or, Not, ITE, Eq and Ne of comparisons (a where's value compared in a where's condition gives them)."""
    if cond in (sympy.true, sympy.false):
        return then if cond == sympy.true else other
    if isinstance(cond, sympy.Not):
        return _choice_text(cond.args[0], other, then)
    if isinstance(cond, (sympy.And, sympy.Or)):
        first, more = cond.args[0], cond.func(*cond.args[1:])
        if isinstance(cond, sympy.And):
            return _choice_text(first, _choice_text(more, then, other), other)
        return _choice_text(first, then, _choice_text(more, then, other))
    if isinstance(cond, sympy.ITE):
        decides, when, unless = cond.args
        return _choice_text(decides, _choice_text(when, then, other), _choice_text(unless, then, other))
    if isinstance(cond, (sympy.Eq, sympy.Ne)):  # a = b: a <= b and a >= b
        equal = sympy.And(sympy.LessThan(cond.lhs, cond.rhs, evaluate=False),
                          sympy.GreaterThan(cond.lhs, cond.rhs, evaluate=False), evaluate=False)
        return _choice_text(equal, then, other) if isinstance(cond, sympy.Eq) else _choice_text(equal, other, then)
    return f"where({_relation_text(cond)}, {then}, {other})"


_CALLS: Mapping[type, str] = {sympy.exp: "exp", sympy.log: "log", sympy.Abs: "abs", sympy.sin: "sin",
                              sympy.cos: "cos", sympy.tan: "tan", sympy.tanh: "tanh", sympy.atan: "atan",
                              sympy.erf: "erf", sympy.Min: "min", sympy.Max: "max"}


class _Printer(StrPrinter):
    """sympy's own readable text, with the expression language's spelling where it differs."""

    def _print_Float(self, e: sympy.Float) -> str:
        return repr(float(e))

    def _print_Exp1(self, e: Any) -> str:
        return "e"

    def _print_Abs(self, e: sympy.Abs) -> str:
        return f"abs({self._print(e.args[0])})"

    def _print_Min(self, e: sympy.Min) -> str:
        return f"min({', '.join(self._print(a) for a in e.args)})"

    def _print_Max(self, e: sympy.Max) -> str:
        return f"max({', '.join(self._print(a) for a in e.args)})"

    def _print_Heaviside(self, e: sympy.Heaviside) -> str:
        return f"heaviside({self._print(e.args[0])})"

    def _print_Piecewise(self, e: sympy.Piecewise) -> str:
        return _piecewise_text(e)


def expression_text(e: sympy.Basic) -> str:
    """`e` written in the spec's expression language: sympy's readable text where it parses back to `e`, else
    fully parenthesised. A random draw is written as its call (randn(), rand()): the text is checked with each
    draw as a name of its own, then the names are replaced by the calls."""
    draws = draws_of([e])
    if not draws:
        return _text_of(e)
    names = {d.symbol: sympy.Symbol(f"{_DRAW_NAME}{d.site}", real=True) for d in draws}
    text = _text_of(e.xreplace(names))
    for d in sorted(draws, key=lambda d: -d.site):  # ac_draw_text_12 before ac_draw_text_1
        text = text.replace(f"{_DRAW_NAME}{d.site}", f"{_DRAW_CALLS[d.kind]}()")
    return text


_DRAW_NAME = "ac_draw_text_"  # no name of a spec starts with ac_, and no sympy text holds one but ours
_DRAW_CALLS = {kind: name for name, kind in DRAW_FUNCTIONS.items()}


def _text_of(e: sympy.Basic) -> str:
    text = _Printer().doprint(e)
    symbols = {str(s): s for s in e.free_symbols}
    try:
        if parse_expression(text, symbols) == e:
            return text
    except SpecError:
        pass
    return _explicit(e)


def _explicit(e: sympy.Basic) -> str:
    if e.is_Symbol:
        return str(e)
    if e is sympy.pi or e is sympy.E:
        return "pi" if e is sympy.pi else "e"
    if e.is_Integer:
        return str(int(e)) if e >= 0 else f"({int(e)})"
    if e.is_Rational:
        return f"({e.p}/{e.q})"
    if e.is_Float:
        return repr(float(e)) if e >= 0 else f"({float(e)!r})"
    if e.is_Add:
        return _join("+", [_explicit(a) for a in e.args])
    if e.is_Mul:
        return _join("*", [_explicit(a) for a in e.args])
    if e.is_Pow:
        return f"({_explicit(e.base)} ** {_explicit(e.exp)})"
    if isinstance(e, sympy.Heaviside):
        return f"heaviside({_explicit(e.args[0])})"
    if isinstance(e, sympy.Piecewise):
        return _piecewise_text(e)
    name = _CALLS.get(type(e))
    if name is None:
        raise SpecError(f"{type(e).__name__} has no spelling in the expression language: {e}")
    return f"{name}({', '.join(_explicit(a) for a in e.args)})"


# ---- the mapping ----

@dataclasses.dataclass
class _Membrane:
    state: str
    charge: sympy.Expr
    threshold: sympy.Expr
    reset: str
    v_reset: sympy.Expr | None


def _membrane(name: str, new: sympy.Expr, z: sympy.Expr, s: sympy.Symbol, inputs: set[sympy.Symbol]
              ) -> _Membrane | None:
    """The reset rule `new` (a state's value after the step) follows, if one does."""
    # sympy's zero and one: a new value that is the spike itself would become Python's 0 and 1 (Symbol.xreplace)
    h = new.xreplace({s: sympy.Integer(0)})
    threshold = h - z
    if threshold.free_symbols & (inputs | {s}):
        return None
    if s not in new.free_symbols:
        return _Membrane(name, h, threshold, "none", None)
    if sympy.expand(new - (h - s * threshold)) == 0:
        return _Membrane(name, h, threshold, "soft", None)
    after = new.xreplace({s: sympy.Integer(1)})
    if sympy.expand(new - (h * (1 - s) + after * s)) == 0:
        return _Membrane(name, h, threshold, "hard", after)
    return None


def _v_reset(value: sympy.Expr, params: list[Param], taken: set[str]) -> tuple[list[Param], dict] | None:
    """Parameters with one named v_reset holding `value` (a parameter or a number), and the renaming; or None
    (also where a state or an input, `taken`, is named v_reset)."""
    names = [p.name for p in params]
    if value.is_Symbol and value.name in names:
        if value.name == "v_reset":
            return params, {}
        if "v_reset" in names or "v_reset" in taken:
            return None
        renamed = [dataclasses.replace(p, name="v_reset") if p.name == value.name else p for p in params]
        return renamed, {value: sympy.Symbol("v_reset", real=True)}
    if value.is_Number and "v_reset" not in names and "v_reset" not in taken:
        return [*params, Param("v_reset", float(value), kind="constant")], {}
    return None


def _v_reset_renamed(params: list[Param], exprs: Sequence[sympy.Expr], taken: set[str]
                     ) -> tuple[list[Param], dict] | None:
    """Parameters with the one named v_reset renamed (and the renaming), where the step reads it but the spec's
    reset is not hard: such a spec would read v_reset as 0, the step reads its value. None where no renaming is
    needed."""
    symbol = sympy.Symbol("v_reset", real=True)
    if not any(p.name == "v_reset" for p in params) or not any(symbol in e.free_symbols for e in exprs):
        return None
    names = {*taken, *(p.name for p in params)}
    new, number = "v_reset_param", 1
    while new in names:
        new, number = f"v_reset_param{number}", number + 1
    renamed = [dataclasses.replace(p, name=new) if p.name == "v_reset" else p for p in params]
    return renamed, {symbol: sympy.Symbol(new, real=True)}


def _free_state(taken: set[str]) -> str:
    """A name for the membrane a spec of the step's own shape adds: none of `taken` (the step's states, parameters
    and inputs, as the spec names them)."""
    found = next((n for n in ("u", "u_spike", "u_membrane") if n not in taken), None)
    number = 1
    while found is None:
        found = f"u_membrane{number}" if f"u_membrane{number}" not in taken else None
        number += 1
    return found


def step_spec(fn: Callable[..., Any], states: Sequence[str], params: Sequence[Param], *, num_inputs: int = 1,
              name: str | None = None, doc: str = "", initial: Mapping[str, float | str] | None = None,
              origin: str = "<python>", dtype: torch.dtype = torch.float32) -> StepSpec:
    """Trace `fn(*inputs, *states, *params)` (the first `num_inputs` arguments the inputs) and map it onto a
    NeuronSpec (see the module doc). `states` and the parameters' names are the step's own; they are renamed
    where the spec language needs it."""
    initial = _checked_initial(initial, states, getattr(fn, "__name__", "the step"), origin)
    traced, inputs, state_names, spec_params = prepare(fn, states, params, num_inputs=num_inputs, origin=origin,
                                                       dtype=dtype)
    # `initial` names the step's states and parameters: spelled as the spec spells them (a state `h` is `h_state`)
    state_of = dict(zip(states, state_names))
    param_of = {p.name: q.name for p, q in zip(params, spec_params)}
    initial = {state_of[n]: param_of.get(v, v) if isinstance(v, str) else v for n, v in initial.items()}
    return from_trace(traced, inputs, state_names, spec_params, name=name, doc=doc, initial=initial,
                      origin=origin)


def _checked_initial(initial: Any, states: Sequence[str], step: str, origin: str) -> dict[str, Any]:
    """`initial` as a dict by state name; a SpecError where it is not a mapping or names no state of the step (an
    initial value that would otherwise be dropped without a word)."""
    if initial is None:
        return {}
    if not isinstance(initial, Mapping):
        raise SpecError(f"{step}: initial: expected a mapping of state names to initial values (a number or a "
                        f"parameter's name), got {type(initial).__name__}", source=origin, field="initial")
    for name in initial:
        if name not in states:
            raise SpecError(f"{step}: initial: {name!r} is not a state of the step (states: "
                            f"{', '.join(states) or 'none'})", source=origin, field=f"initial.{name}",
                            symbol=str(name))
    return dict(initial)


def from_trace(traced: Trace, inputs: list[str], states: list[str], params: list[Param], *, name: str | None = None,
               doc: str = "", initial: Mapping[str, float | str] | None = None, origin: str = "<python>"
               ) -> StepSpec:
    """The spec of a traced step whose arguments are `inputs`, `states` and `params` (spec names): a symbolic
    stage under the CPU-time budget (`budget.bounded`), as a written spec's."""
    try:
        return budget.bounded(origin, "step", _mapped, traced, inputs, states, params, name=name, doc=doc,
                              initial=initial, origin=origin)
    except SpecError as error:
        if error.source != "<python>":
            raise
        # an expression the spec language cannot write (a condition of several comparisons): at the step (its
        # definition, else the last line of it the trace recorded)
        where = origin if origin != "<python>" else next((line for line in reversed(traced.lines) if line), origin)
        raise SpecError(f"{traced.name}: {error.message}", source=where, field=error.field,
                        symbol=error.symbol) from None


def _mapped(traced: Trace, inputs: list[str], states: list[str], params: list[Param], *, name: str | None = None,
            doc: str = "", initial: Mapping[str, float | str] | None = None, origin: str = "<python>") -> StepSpec:
    budget.reuse(traced)  # the trace's CPU time counts against this stage's budget: one budget per step function
    values = _sympy(traced, origin)
    returns = [values[i] for i in traced.returns]
    count = len(returns) - len(states)
    input_symbols, s = {sympy.Symbol(n, real=True) for n in inputs}, S
    outputs, news = tuple(returns[:count]), dict(zip(states, returns[count:]))
    spike = traced.spike
    z = values[spike.argument] if spike is not None else None
    detach = False
    if spike is not None:
        users = [n for n, e in news.items() if DETACHED in e.free_symbols]
        if len(users) > 1 or any(DETACHED in o.free_symbols for o in outputs):
            raise SpecError(f"{traced.name}: the detached spike (s.detach()) may appear only in the membrane's "
                            f"reset (SpikingJelly's detach_reset)", source=spike.line, symbol="detach")
        detach = bool(users)
        news = {n: e.xreplace({DETACHED: s}) for n, e in news.items()}
    found, step_params = None, [p.name for p in params]
    initial = dict(initial or {})
    if z is not None:
        for state in ([users[0]] if detach else states):
            found = _membrane(state, news[state], z, s, input_symbols)
            if found is not None and found.reset == "hard":
                renamed = _v_reset(found.v_reset, params, {*states, *inputs})
                if renamed is None:
                    found = None
                    continue
                params, renames = renamed
                news = {n: e.xreplace(renames) for n, e in news.items()}
                outputs = tuple(o.xreplace(renames) for o in outputs)
                found.charge, found.threshold = found.charge.xreplace(renames), found.threshold.xreplace(renames)
                step_params = [str(renames.get(sympy.Symbol(n, real=True), n)) for n in step_params]
                # an initial value naming the parameter the reset reads names it by its new name, v_reset
                initial = {n: str(renames.get(sympy.Symbol(v, real=True), v)) if isinstance(v, str) else v
                           for n, v in initial.items()}
            if found is not None:
                break
    if found is None and detach:
        raise SpecError(f"{traced.name}: s.detach() is used, but no state's new value is a reset rule of the "
                        f"spike (hard: h * (1 - s) + s * v_reset, soft: h - s * threshold)",
                        source=spike.line if spike else origin, symbol="detach")
    if found is None or found.reset != "hard":
        # a spec reads v_reset as 0 unless its reset is hard (docs/semantics.md); the step reads its value
        unread = _v_reset_renamed(params, [*news.values(), *outputs, *([z] if z is not None else [])],
                                  {*states, *inputs})
        if unread is not None:
            params, renames = unread
            news = {n: e.xreplace(renames) for n, e in news.items()}
            outputs = tuple(o.xreplace(renames) for o in outputs)
            z = z.xreplace(renames) if z is not None else None
            if found is not None:
                found.charge, found.threshold = found.charge.xreplace(renames), found.threshold.xreplace(renames)
            step_params = [str(renames.get(sympy.Symbol(n, real=True), n)) for n in step_params]
            initial = {n: str(renames.get(sympy.Symbol(v, real=True), v)) if isinstance(v, str) else v
                       for n, v in initial.items()}
    fields = _fields(found, news, states) if found is not None else \
        _own_fields(news, states, z, {*states, *inputs, *(p.name for p in params)})
    init = {n: initial.get(n, 0.0) for n in fields["state_order"]}
    spec = NeuronSpec(name=clean_spec_name(name or traced.name), doc=doc, params=tuple(params),
                      states=tuple(State(n, init[n]) for n in fields["state_order"]),
                      charge=fields["charge"], threshold=fields["threshold"], reset=fields["reset"],
                      updates=fields["updates"], surrogate=spike.surrogate if spike else Sigmoid(),
                      inputs=tuple(inputs), fires_at=">" if spike and spike.strict else ">=", detach_reset=detach,
                      origin=origin)
    return StepSpec(spec, tuple(states), tuple(step_params), tuple(_output(o, news, s) for o in outputs), detach,
                    spike is not None)


def _fields(m: _Membrane, news: Mapping[str, sympy.Expr], states: list[str]) -> dict[str, Any]:
    h = sympy.Symbol("h", real=True)
    charge = m.charge
    exprs = {n: _with_h(news[n], charge, h) for n in states if n != m.state}
    _draws_once([charge, m.threshold, *exprs.values()])
    updates = tuple((n, expression_text(e)) for n, e in exprs.items())
    return {"state_order": [m.state, *(n for n in states if n != m.state)], "charge": expression_text(charge),
            "threshold": expression_text(m.threshold), "reset": m.reset, "updates": updates}


def _draws_once(exprs: Sequence[sympy.Expr]) -> None:
    """Refuse a random draw that the spec's text would write more than once: each call written in a spec is a
    draw of its own (`spec.draws`), so the text would draw it anew at each place."""
    for draw in draws_of(exprs):
        uses = sum(_occurrences(e, draw.symbol) for e in exprs)
        if uses > 1:
            call = f"torch.{_DRAW_CALLS[draw.kind]}_like"
            raise SpecError(f"the value of one {call}(...) call is used in {uses} places of the step's equations "
                            "(charge, threshold, updates), which a spec writes as that many independent draws; "
                            "use it in one equation (add it to the charge, say), or call it once per use",
                            symbol=call)


def _occurrences(e: sympy.Basic, symbol: sympy.Symbol) -> int:
    return sum(1 for node in sympy.preorder_traversal(e) if node == symbol)


def _with_h(e: sympy.Expr, charge: sympy.Expr, h: sympy.Symbol) -> sympy.Expr:
    """`e` with the charge written as h where it appears (the same value: the kernel computes it once)."""
    return e if charge.is_Atom else e.subs(charge, h)


def _own_fields(news: Mapping[str, sympy.Expr], states: list[str], z: sympy.Expr | None, taken: set[str]
                ) -> dict[str, Any]:
    u = _free_state(taken)
    _draws_once([*(news[n] for n in states), *([z] if z is not None else [])])
    updates = tuple((n, expression_text(news[n])) for n in states)
    return {"state_order": [u, *states], "charge": expression_text(z) if z is not None else "0",
            "threshold": "0" if z is not None else "1", "reset": "none", "updates": updates}


def _output(e: sympy.Expr, news: Mapping[str, sympy.Expr], s: sympy.Symbol) -> Output:
    if e == s:
        return Output(SPIKE)
    state = next((n for n, new in news.items() if new == e), None)
    return Output(STATE, state) if state is not None else Output(EXPRESSION, expr=expression_text(e))


# ---- the decorator ----

def _origin(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "<python>"


def _param(name: str, default: Any, learnable: Sequence[str], constants: Sequence[str],
           domains: Mapping[str, str]) -> Param:
    if isinstance(default, Param):
        return dataclasses.replace(default, name=name)
    kind: Kind | None = "constant" if name in constants else ("tensor" if name in learnable else None)
    return Param(name, default, kind=kind, learnable=name in learnable, domain=domains.get(name, ""))


def neuron(fn: Callable[..., Any] | None = None, *, name: str | None = None, doc: str | None = None,
           learnable: Sequence[str] = (), constants: Sequence[str] = (), domains: Mapping[str, str] | None = None,
           initial: Mapping[str, float | str] | None = None, num_inputs: int = 1) -> Any:
    """A NeuronSpec from a step function `f(x, *states, *params) -> (spike, *new_states)`: the first argument is
    the input (the first `num_inputs` arguments the inputs, as in `f(g_e, g_i, v, ...)`), the arguments without
    defaults are the states (the membrane among them), those with defaults the parameters (runtime scalars;
    `learnable` names tensors that are learned, `constants` names baked into the kernel, `domains` their allowed
    values as in TOML). `initial` gives states' initial values (default 0; a number or a parameter's name). Name
    and doc default to the function's."""
    if fn is None:
        return lambda f: neuron(f, name=name, doc=doc, learnable=learnable, constants=constants, domains=domains,
                                initial=initial, num_inputs=num_inputs)
    if isinstance(num_inputs, bool) or not isinstance(num_inputs, int) or num_inputs < 1:
        raise SpecError(f"num_inputs: expected a positive integer, got {num_inputs!r}", symbol="num_inputs")
    title = step_name(fn)
    positional = signature_names(fn)
    if positional and positional[0].name in ("self", "cls") and not inspect.ismethod(fn):
        raise SpecError(f"{title}: its first argument is {positional[0].name!r}: @autocuda.neuron takes a plain "
                        f"function (a method's self would be read as the input x); write it outside the class, "
                        f"or as a staticmethod", source=_origin(fn), symbol=positional[0].name)
    extra = next((p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind == inspect.Parameter.VAR_KEYWORD), None)
    if extra is not None:
        raise SpecError(f"{title} takes **{extra}: the step is called with positional arguments only, so it "
                        f"would get nothing there; name each input, state and parameter", source=_origin(fn),
                        symbol=extra)
    if len(positional) < num_inputs or any(p.default is not inspect.Parameter.empty
                                           for p in positional[:num_inputs]):
        first = "the first argument is the input x" if num_inputs == 1 else \
            f"the first {num_inputs} arguments are the inputs"
        raise SpecError(f"{getattr(fn, '__name__', fn)!r}: {first} (without a default)")
    # The step is called with positional arguments only: a keyword-only argument would keep its default as a
    # constant of the kernel, not be the parameter its default makes it look like
    keyword = [p.name for p in inspect.signature(fn).parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
    if keyword:
        raise SpecError(f"{title}: keyword-only argument {keyword[0]!r}: inputs, states and parameters are "
                        f"positional arguments (a parameter is one with a default; write it before any '*')",
                        source=_origin(fn), field=f"params.{keyword[0]}", symbol=keyword[0])
    rest = positional[num_inputs:]
    states = [p.name for p in rest if p.default is inspect.Parameter.empty]
    defaults = [p for p in rest if p.default is not inspect.Parameter.empty]
    if [p.name for p in rest] != [*states, *(p.name for p in defaults)]:
        raise SpecError(f"{title}: list the states (no defaults) before the parameters (with defaults)")
    if name is not None and spec_name_problem(name) is not None:  # the function's own name is cleaned instead
        raise SpecError(f"name {name!r}: {spec_name_problem(name)}", source=_origin(fn), field="name")
    # A layer takes the parameters by these names: one the spec would respell (as a traced core's) is refused
    taken = {*RESERVED, *input_names([p.name for p in positional[:num_inputs]])}
    for p in defaults:
        problem = name_problem(p.name) or ("is the spec's name of a step input, the charge or the spike"
                                           if p.name in taken else None)
        if problem is not None:
            raise SpecError(f"{title}: parameter {p.name!r} {problem}: rename the argument",
                            source=_origin(fn), field=f"params.{p.name}", symbol=p.name)
    params = [_param(p.name, p.default, learnable, constants, domains or {}) for p in defaults]
    unknown = set(learnable) | set(constants) | set(domains or {})
    unknown -= {p.name for p in params}
    if unknown:
        raise SpecError(f"{title}: {sorted(unknown)[0]!r} is not a parameter (an argument with a default)",
                        symbol=sorted(unknown)[0])
    text = doc if doc is not None else inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    step = step_spec(fn, states, params, name=name or title, doc=text, initial=initial,
                     origin=_origin(fn), num_inputs=num_inputs)
    if [o.kind for o in step.outputs] != [SPIKE]:
        returned = len(step.outputs) + len(states)
        what = (f"returned {returned} value{'s' * (returned != 1)}, not {1 + len(states)}"
                if len(step.outputs) != 1 else "its first value is not the spike (the result of the surrogate's call)")
        raise SpecError(f"{title} must return (spike, *new_states): the spike (the surrogate's result), then "
                        f"the new value of each state ({', '.join(states)}), in order; {what}",
                        source=_origin(fn), symbol="returns")
    if step.surrogate is None:
        raise SpecError(f"{title} calls no surrogate spike function: write s = surrogate(h - threshold)",
                        source=_origin(fn), symbol="surrogate")
    if any(p.name == "v_reset" and q != "v_reset" for p, q in zip(defaults, step.params)):
        # the layer's keyword would not be the argument's name (`_v_reset_renamed`)
        raise SpecError(f"{title}: parameter 'v_reset' is read by the step, but no state's new value is a "
                        f"hard reset to it (h * (1 - s) + v_reset * s), and a spec whose reset is not hard reads "
                        f"v_reset as 0: rename the argument (v_rest, say)", source=_origin(fn),
                        field="params.v_reset", symbol="v_reset")
    return step.spec


# ---- Python files ----

def load_python_spec(path_and_name: str) -> NeuronSpec:
    """The NeuronSpec a Python file defines (e.g. with @autocuda.neuron): `file.py`, or `file.py:name` where the
    file defines several. The file is executed: it is the user's own code, trusted as any script they run."""
    import runpy

    path, _, wanted = path_and_name.partition(".py:")
    path = path if path.endswith(".py") else f"{path}.py"
    found = [v for v in runpy.run_path(path, run_name="__autocuda_spec__").values() if isinstance(v, NeuronSpec)]
    names = ", ".join(s.name for s in found) or "none"
    chosen = [s for s in found if not wanted or s.name == wanted]
    if len(chosen) != 1:
        what = f"no spec named {wanted!r}" if wanted else (
            "no NeuronSpec (decorate a step function with @autocuda.neuron)" if not found else
            "several specs: name one as FILE.py:NAME")
        raise SpecError(f"{what} (specs defined: {names})", source=path, symbol=wanted or None)
    return chosen[0]
