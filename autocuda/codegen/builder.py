"""The vocabulary the forward and backward plans are written in: parameters, registers, loads and stores, and
statements printed from sympy (with invariants hoisted out of the time loop and common subexpressions shared)."""
from __future__ import annotations

import dataclasses
import functools

import sympy as sp

from ..spec.derive import (
    EVENT,
    GRAD_SPIKE,
    SPIKE,
    THRESHOLD,
    Derivation,
    H,
    adjoint_symbol,
    level_gradient_symbol,
    spike_levels,
)
from ..spec.draws import system_draws
from ..toolchain.cnames import DRAW_KEYS, FIXED_KEYS, c_name, input_register
from .broadcast import CHANNEL_KEYS, GRADIENT_GROUP, PARAM_INDEX, PER_CHANNEL, SHARED
from .ckernel import CParam
from .dtypes import fill
from .noise import cached_draw_function, draw_function
from .options import KernelOptions, KernelPlan, Statement, Transfer
from .printer import CudaPrinter

H_PREVIOUS = sp.Symbol("ac_h_prev", real=True)


def kernel_param(key: str, ctype: str, pointer: bool, const: bool) -> CParam:
    """A parameter passed under `key`, spelled as the key where that holds no user's name (`FIXED_KEYS`), else
    through `c_name`."""
    return CParam(key, ctype, pointer, const, key if key in FIXED_KEYS else c_name(key))



class Builder:
    """Shared vocabulary of the forward and backward builders: names, loads, stores, printing."""

    def __init__(self, derivation: Derivation, options: KernelOptions):
        self.d, self.o, self.plan = derivation, options, KernelPlan()
        self.storage, self.native = options.dtype, options.native
        self.compute = self.storage if self.native else self.storage.compute
        # Tensor parameters and their gradients live in float (double for float64), whatever the arithmetic.
        self.param_dtype = self.storage.compute
        self.multi = options.multi_step
        system = derivation.system
        self.tensor_params = dict(options.tensor_params)
        names = {u: f"{input_register(u.name)}[lane]" for u in system.inputs}
        names |= {H: "ac_h", SPIKE: "ac_s", THRESHOLD: "ac_thr", EVENT: "ac_e",
                 GRAD_SPIKE: "ac_grad_s[lane]", H_PREVIOUS: "ac_h_prev[lane]"}
        names |= {(g := level_gradient_symbol(k)): g.name for k in range(len(spike_levels(system)))}
        names |= {s: f"{c_name(s.name)}[lane]" for s in system.states}
        names |= {adjoint_symbol(s): f"{c_name(s.name, 'grad')}[lane]" for s in system.states}
        scalar = self.compute.broadcast or "{x}"  # scalars arrive as floats; native words need both lanes
        names |= {p: (f"{c_name(p.name, 'param')}[lane]" if p in self.tensor_params
                      else fill(scalar, x=c_name(p.name))) for p in system.params}
        self.printer = CudaPrinter(self.compute, names)
        self.temp_count = 0
        self.invariant_symbols = frozenset(system.params)
        # Invariants of these alone are the same for every lane: one register per thread, not one per lane.
        self.lane_free = {p for p in system.params if p not in self.tensor_params}
        self.invariants: dict[sp.Expr, sp.Symbol] = {}
        self.sealed = 0  # the first `sealed` invariants share common subexpressions among themselves only (`seal`)
        self.plan.params += [kernel_param("N", "long long", False, True)]
        if self.multi:
            self.plan.params += [kernel_param("T", "long long", False, True)]

    # -- declarations ---------------------------------------------------------------------------------
    def pointer(self, key: str, const: bool, compute_type: bool = False) -> str:
        """Declare a pointer parameter passed under `key`; returns its C spelling."""
        ctype = (self.param_dtype if compute_type else self.storage).element
        param = kernel_param(key, ctype, True, const)
        self.plan.params.append(param)
        return param.cname

    def register(self, *names: str) -> None:
        self.plan.registers += [n for n in names if n not in self.plan.registers]

    def load(self, target: str, pointer: str, offset: str, comment: str, otherwise: str | None = None,
             accumulate: bool = False, compute_type: bool = False) -> Transfer:
        """register[lane] = element (converted to the compute type); added to it when `accumulate`. With
        `compute_type` the element is of the arithmetic's type (as `pointer(..., compute_type=True)` declares)."""
        value, pair = self.storage.element_load, self.storage.pair_elements
        if compute_type:
            value, pair = "{x}", self.storage.pair_floats
        if accumulate:
            value = self.compute.op("add", f"{target}[lane]", value)
            pair = self.compute.op("add", f"{target}[lane]", pair)
        element = (self.param_dtype if compute_type else self.storage).element
        return Transfer(comment, target, pointer, offset, value, element, guard="t > 0" if otherwise
                        else "", otherwise=otherwise or "", streamable=not accumulate, pair=pair,
                        vectorizable=not compute_type)

    def initial(self, target: str, state: str) -> Transfer:
        """register[lane] = the initial value of `state`: its element of <state>_init, or the one number
        passed by value for every neuron (`given_inits=False`: nothing to read, no tensor to fill)."""
        if self.o.given_inits:
            return self.load(target, self.pointer(f"{state}_init", const=True), "ac_n0", f"initial {state}")
        param = kernel_param(f"{state}_init", self.param_dtype.ctype, False, True)
        self.plan.params.append(param)
        if self.native:
            value = fill(self.compute.broadcast, x=param.cname)
        else:  # rounded through the storage type, as an element of a tensor holding it would be
            value = fill(self.storage.element_load, x=fill(self.storage.element_store, x=param.cname))
        return Transfer(f"initial {state}: one value for every neuron", target, "", "", value, vectorizable=False)

    def store(self, pointer: str, offset: str, register: str, comment: str, compute_type: bool = False) -> Transfer:
        value = "{x}" if compute_type else self.storage.element_store
        element = (self.param_dtype if compute_type else self.storage).element
        halves = self.storage.float_halves if compute_type else self.storage.halves
        return Transfer(comment, register, pointer, offset, value, element, store=True,
                        vectorizable=not compute_type, halves=halves)

    def params_setup(self) -> None:
        system = self.d.system
        for p in system.params:
            if p in self.tensor_params:
                pointer, register = self.pointer(p.name, const=True, compute_type=True), c_name(p.name, "param")
                self.register(register)
                offset, per_lane = PARAM_INDEX[self.tensor_params[p]]
                self.plan.setup.append(Transfer(f"parameter {p.name}", register, pointer, offset,
                                                element=self.param_dtype.element, vectorizable=False,
                                                per_lane=per_lane, pair=self.storage.pair_floats))

    def scalar_params(self) -> None:
        for p in self.d.system.params:
            if p not in self.tensor_params:
                self.plan.params.append(kernel_param(p.name, self.param_dtype.ctype, False, True))
        if self.o.per_channel:
            self.plan.params += [kernel_param(key, "long long", False, True) for key in CHANNEL_KEYS]
        if self.plan.draws:
            self.plan.params += [kernel_param(key, ctype, False, True)
                                 for key, ctype in zip(DRAW_KEYS, ("unsigned int", "unsigned int", "long long"))]

    def draws(self) -> None:
        """The step's random draws (`spec.draws`), made first in each step from the call's seed, for every neuron of
        the thread (`autocuda.codegen.noise`: the counter is the neuron, ac_step0 + t, the call site). Forward and
        backward make the same draws: nothing is stored."""
        draws = system_draws(self.d.system)
        if not draws:
            return
        if self.native:
            raise ValueError("a step with random draws (randn(), rand()) runs in float arithmetic: native packed "
                             "arithmetic (native=True) makes no draws")
        precision = self.plan.draws = "double" if self.compute.name == "float64" else "float"
        for i, draw in enumerate(draws):
            self.printer.names[draw.symbol] = draw.symbol.name
            if self.multi:  # a time loop keeps each site's group of draws per lane (`noise.cached_draw_function`)
                cache = f"ac_draw_cache{draw.site}"
                self.plan.draw_caches.append(cache)
                call = f"{cached_draw_function(draw.kind, precision)}({cache}[lane], ac_n0 + lane, ac_step0 + t, "
            else:
                call = f"{draw_function(draw.kind, precision)}(ac_n0 + lane, ac_step0, "
            self.statement(draw.symbol.name, f"{call}{draw.site}u, ac_seed_lo, ac_seed_hi)",
                           comment="random draws" if i == 0 else "")

    def param_gradient(self, param: sp.Symbol, register: str) -> Transfer:
        """The store of a learnable tensor parameter's gradient, summed over the thread's steps in `register`:
        one partial sum per neuron (a parameter per neuron), per group of neurons (a shared one:
        `Transfer.group_sum`), or added into its channel's sum (`Transfer.channel_sum`; the caller passes zeros)."""
        name = param.name
        pointer = self.pointer(f"grad_{name}", const=False, compute_type=True)
        store = self.store(pointer, "ac_n0", register, f"per-neuron sum of d loss / d {name}", compute_type=True)
        spread = self.tensor_params.get(param)
        if spread == PER_CHANNEL:
            return dataclasses.replace(store, comment=f"d loss / d {name}, added into each channel's sum",
                                       channel_sum=True)
        if spread is SHARED:
            return dataclasses.replace(store, comment=f"d loss / d {name}, one sum per {GRADIENT_GROUP} neurons",
                                       group_sum=True)
        return store

    # -- printing -------------------------------------------------------------------------------------
    def hoist(self, expr: sp.Expr) -> sp.Expr:
        """`expr` with its subexpressions of parameters alone (1/tau, exp(-1/tau_w), ...) replaced by registers
        computed once before the time loop: a division by a runtime value inside the loop stops the compiler
        from issuing later steps' loads early."""
        parts = invariant_parts(expr, self.invariant_symbols)
        if not parts:
            return expr
        found = {e: self._invariant(e) for e in parts}
        return replaced(expr, tuple(found.items()))

    def _invariant(self, expr: sp.Expr) -> sp.Symbol:
        symbol = self.invariants.get(expr)
        if symbol is None:
            symbol = self.invariants[expr] = sp.Symbol(f"ac_k{len(self.invariants) + 1}", real=True)
            self._name_invariant(symbol, expr)
        return symbol

    def _name_invariant(self, symbol: sp.Symbol, value: sp.Expr) -> bool:
        """Name `symbol` for the printer: a register per thread where `value` is lane free, else one per lane.
        Returns whether it is lane free."""
        free = free_symbols(value) <= self.lane_free
        if free:
            self.lane_free.add(symbol)
            self.printer.names[symbol] = symbol.name
        else:
            self.register(symbol.name)
            self.printer.names[symbol] = f"{symbol.name}[lane]"
        return free

    def _compute_once(self, comment: str, symbol: sp.Symbol, value: sp.Expr, free: bool) -> None:
        if free:
            self.plan.constants.append(Statement(symbol.name, self.printer(value), comment=comment))
        else:
            self.plan.setup.append(Transfer(comment, symbol.name, "", "", self.printer(value), vectorizable=False))

    def seal(self) -> None:
        """Close the invariants hoisted so far into a group of their own: `done` shares subexpressions within it
        alone, so they are computed exactly as a kernel that hoisted only them computes them (a replay of
        forward's step in backward gets forward's values, bit for bit)."""
        self.sealed = len(self.invariants)

    def done(self) -> KernelPlan:
        """The plan, with the hoisted invariants computed after everything else is set up (parameters loaded).
        They share common subexpressions like the loop body does: the coefficients of a discretised linear system
        repeat each other, and printed one by one they make sources that are slow to compile."""
        items = list(self.invariants.items())
        first = 0  # the ac_kc<i> names go on counting from one group into the next
        for group in (items[:self.sealed], items[self.sealed:]):
            if not group:
                continue
            replacements, reduced, drawn = shared_subexpressions(tuple(expr for expr, _ in group), "ac_kc", first)
            first += drawn
            for symbol, value in replacements:
                self._compute_once("parameters only, once", symbol, value, self._name_invariant(symbol, value))
            for (expr, symbol), value in zip(group, reduced):
                self._compute_once(_once_comment(expr), symbol, value, symbol in self.lane_free)
        return self.plan

    def emit(self, exprs: list[sp.Expr], comment: str = "") -> list[str]:
        """Common subexpressions of `exprs` as declared temporaries; returns the printed reduced exprs."""
        hoisted = tuple(self.hoist(e) for e in exprs)
        replacements, reduced, drawn = shared_subexpressions(hoisted, "ac_c", self.temp_count)
        self.temp_count += drawn
        for i, (symbol, value) in enumerate(replacements):
            self.printer.names[symbol] = symbol.name
            self.plan.body.append(Statement(symbol.name, self.printer(value), comment=comment if i == 0 else ""))
        return [self.printer(e) for e in reduced]

    def statement(self, target: str, expr: sp.Expr | str, comment: str = "", declare: bool = True,
                  guard: str = "", otherwise: str = "") -> None:
        value = expr if isinstance(expr, str) else self.printer(self.hoist(expr))
        self.plan.body.append(Statement(target, value, declare, comment, guard, otherwise))


# The kernels of one derivation (in every dtype, option and layout) hoist, name and print the same expressions: the
# pure functions of an expression that they ask are cached.
@functools.lru_cache(maxsize=8192)
def invariant_parts(expr: sp.Expr, invariant_symbols: frozenset[sp.Symbol]) -> tuple[sp.Expr, ...]:
    """The subexpressions of `expr` that `Builder.hoist` computes once, in the order it meets them: each largest
    expression of `invariant_symbols` alone (and of no other symbol) that is not a symbol or its negation."""
    found: list[sp.Expr] = []
    kinds: dict[sp.Basic, bool | None] = {}

    def kind(e: sp.Basic) -> bool | None:
        """True: invariant symbols alone; False: depends on the step; None: no symbols (one pass, bottom up)."""
        if e not in kinds:
            if e.is_Symbol:
                kinds[e] = e in invariant_symbols
            else:
                parts = [kind(a) for a in e.args]
                kinds[e] = False if False in parts else (True if True in parts else None)
        return kinds[e]

    def take(e: sp.Basic) -> None:
        """Take `e`, of invariant symbols alone, or the largest expressions within it."""
        if isinstance(e, sp.Expr):
            if e.args and not (-e).is_Symbol:  # a negated parameter costs nothing in the loop
                found.append(e)
            return
        for arg in e.args:
            if kind(arg):
                take(arg)

    def visit(e: sp.Basic) -> None:
        for arg in e.args:
            (take if kind(arg) else visit)(arg)
    (take if kind(expr) else visit)(expr)
    return tuple(found)


@functools.lru_cache(maxsize=8192)
def replaced(expr: sp.Expr, replacements: tuple[tuple[sp.Expr, sp.Symbol], ...]) -> sp.Expr:
    """`expr.xreplace(dict(replacements))`."""
    return expr.xreplace(dict(replacements))


@functools.lru_cache(maxsize=8192)
def free_symbols(expr: sp.Basic) -> frozenset[sp.Basic]:
    """`expr.free_symbols` (a walk of the whole expression)."""
    return frozenset(expr.free_symbols)


@functools.lru_cache(maxsize=4096)
def shared_subexpressions(exprs: tuple[sp.Expr, ...], prefix: str, first: int
                          ) -> tuple[tuple[tuple[sp.Symbol, sp.Expr], ...], tuple[sp.Expr, ...], int]:
    """sympy's cse of `exprs` (order "none"), its temporaries named <prefix><first + 1>, <prefix><first + 2>, ...:
    (replacements, reduced exprs, how many names cse drew; it skips those the exprs hold already). A pure function
    of its arguments, so cached: the kernels of one derivation in other dtypes or options repeat their
    statements, and cse is the costliest step of printing them."""
    drawn = 0

    def names():
        nonlocal drawn
        while True:
            drawn += 1
            yield sp.Symbol(f"{prefix}{first + drawn}", real=True)
    replacements, reduced = sp.cse(list(exprs), symbols=names(), order="none")
    return tuple(replacements), tuple(reduced), drawn


@functools.lru_cache(maxsize=4096)
def _once_comment(expr: sp.Expr) -> str:
    """The comment of an invariant computed once: its text where it is short."""
    return f"{sp.sstr(expr)}, once" if _nodes(expr) <= 12 else "parameters only, once"


def _nodes(expr: sp.Basic, limit: int = 100) -> int:
    """The number of nodes of `expr`, counted up to `limit` (printing a large expression is slow)."""
    count = 0
    for _ in sp.preorder_traversal(expr):
        count += 1
        if count >= limit:
            break
    return count
