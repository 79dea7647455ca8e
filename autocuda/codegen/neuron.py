"""Neuron kernels from a derivation: FPTT, BPTT and their single-step forms, for any dtype.

The kernel's parameter list is declared once here (`_Signature`); the template frames the printed body.
Tensor parameter names are the interface to the op layer:
    forward:  x_seq, <state>_init, [tensor params] -> spike_seq, h_seq, <state>_seq, <state>_checkpoints,
              <state>_final
    backward: grad_spike_seq, grad_<state>_seq, grad_<state>_final, h_seq, <state>_seq, <state>_checkpoints,
              x_seq, <state>_init
              -> grad_x_seq, grad_<state>_init, grad_<param> (per-neuron partial sums, reduced by the caller)
              (x_seq only where the adjoint needs x and cannot take it back from h: `BackwardStep.needs_x`;
              <state>_checkpoints [T // K, N] instead of the saved <state>_seq where backward replays: row j is
              the state after step (j + 1)·K - 1, K = `replay_steps`)
Single-step kernels use the same names with T = 1 and no time loop. With `given_inits=False` every
<state>_init is one number for all neurons, passed by value, and backward returns no grad_<state>_init.
In the source, every name made from a user's (states, parameters, the arguments named after them) is spelled by
`cnames.c_name`; the arguments' keys above stay as they are (`CParam.name` is the key, `CParam.cname` the C).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

from ..ckernel import CKernel, CParam
from ..cnames import c_name, comment_text
from ..dtypes import DType, get_dtype, headers_for
from ..spec.derive import GRAD_SPIKE, SPIKE, SURROGATE_GRAD, THRESHOLD, Derivation, H, adjoint_symbol, previous_membrane
from ..spec.names import FIXED_KEYS
from .printer import CudaPrinter

KERNELS = ("fptt", "bptt", "step-forward", "step-backward")
SURROGATE_INPUT = sp.Symbol("z", real=True)   # the variable of a surrogate gradient expression
_H_PREVIOUS = sp.Symbol("ac_h_prev", real=True)
_H_STORED = sp.Symbol("ac_h_stored", real=True)
VECTOR_CTYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}  # bytes of one aligned access -> C type


# Steps between checkpoints of replayed states, by default: 4/K bytes per neuron-step each way in float32 (against 4
# for the saved sequence's), and two [K][lanes] register arrays per thread in backward. Long loops over few neurons
# take more (`runtime.neuron.LONG_LOOP`): there a segment's loads are what keeps memory busy.
REPLAY_STEPS = 8


@dataclass(frozen=True)
class KernelOptions:
    """Everything besides the derivation that changes a kernel's text."""

    kernel: str                                          # one of KERNELS
    dtype: DType
    tensor_params: tuple[tuple[sp.Symbol, bool], ...] = ()  # runtime tensors: (symbol, one value per neuron?)
    store_state_seq: bool = False                        # forward writes every state's sequence
    save_for_backward: bool = True                       # forward writes what backward reads
    grad_state_seq: bool = False                         # backward receives gradients of the state sequences
    grad_finals: bool = True                             # backward receives gradients of the final states (else 0)
    given_inits: bool = True                             # initial states as tensors (else one value each, by value)
    final_states: bool = True                            # forward writes the final states (multi-step: may skip)
    lanes: int = 0                                       # neurons per thread (0: the dtype's word width)
    vector: bool = False                                 # one aligned access per transfer (needs N % lanes == 0)
    unroll: int = 1                                      # unrolling of the time loop (lets loads run ahead)
    prefetch: int = 0                                    # steps of streamed inputs kept in flight (0, 1: none)
    staged: int = 0                                      # steps per block of streamed inputs loaded into registers
    staged_blocks: int = 1                               # ... that many blocks ahead (`staged_steps`)
    native: bool = False                                 # half2/bfloat162 arithmetic instead of float
    block: int = 256                                     # threads per block (sizes the prefetch ring in shared memory)
    replay: int = REPLAY_STEPS                           # steps per checkpoint of replayed states (`replay_steps`)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {KERNELS}")
        for name, least in (("staged", 0), ("staged_blocks", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: an int >= {least}, got {value!r}")
        if self.prefetch > 1 and self.staged > 1:
            raise ValueError("prefetch (a ring in shared memory) and staged (registers) are two ways of loading "
                             f"ahead: give one (got prefetch={self.prefetch}, staged={self.staged})")
        if isinstance(self.replay, bool) or not isinstance(self.replay, int) or self.replay < 0:
            raise ValueError(f"replay: steps per checkpoint, an int >= 0 (0 or 1: every step), got {self.replay!r}")
        object.__setattr__(self, "dtype", get_dtype(self.dtype))
        if not self.lanes:
            object.__setattr__(self, "lanes", self.dtype.width)
        if not self.final_states and self.kernel != "fptt":
            raise ValueError(f"final_states=False applies to the multi-step forward ('fptt'): a {self.kernel!r} "
                             "kernel's outputs need every state")
        if self.native and not (self.dtype.packed and self.lanes % self.dtype.width == 0):
            raise ValueError(f"native packed arithmetic needs float16 or bfloat16 and an even number of lanes "
                             f"(got {self.dtype.name}, {self.lanes} lanes)")
        if self.vector and self.lanes * self.dtype.torch_dtype.itemsize not in VECTOR_CTYPES:
            raise ValueError(f"no vector access of {self.lanes} {self.dtype.name} elements; "
                             f"vector sizes in bytes: {sorted(VECTOR_CTYPES)}")


@dataclass(frozen=True)
class Transfer:
    """Moving values between memory and a register array, in two phases through a staging array of
    elements: fetch (vector or element by element) then convert, or convert then write.

    Conversions hold `{x}` (and `{a}`, `{b}`) for the other side: `value` converts one element to or from the
    compute type; with native packed arithmetic `pair` builds a word from two elements and `halves` take one
    apart. `guard` (a C condition) gives every register `otherwise` when false.
    """

    comment: str
    register: str
    pointer: str                 # "" for a value computed, not loaded (it then sits in `value`)
    offset: str
    value: str = "{x}"
    element: str = ""            # C type of one element in memory
    store: bool = False
    guard: str = ""
    otherwise: str = ""
    vectorizable: bool = True
    streamable: bool = True      # a per-step load that may be issued steps ahead (not an accumulation)
    per_lane: bool = True        # False: every lane reads element `offset` (a parameter shared by all)
    pair: str = ""
    halves: tuple[str, str] = ("", "")

    @property
    def element_ref(self) -> str:
        return f"{self.pointer}[{self.offset} + lane]" if self.per_lane else f"{self.pointer}[{self.offset}]"

    def lane_value(self, element: str) -> str:
        """The C value moved for one lane, given the text of the element (or register) on the other side."""
        return self.value.replace("{x}", element)

    def pair_value(self, low: str, high: str) -> str:
        return self.pair.replace("{a}", low).replace("{b}", high)

    def half_value(self, which: int, word: str) -> str:
        return self.halves[which].replace("{x}", word)


@dataclass(frozen=True)
class Statement:
    """`target = value;` (declared const when `declare`); with a `guard`, `otherwise` where it is false."""

    target: str
    value: str
    declare: bool = True
    comment: str = ""
    guard: str = ""
    otherwise: str = ""


def kernel_param(key: str, ctype: str, pointer: bool, const: bool) -> CParam:
    """A parameter passed under `key`, spelled as the key where that holds no user's name (`FIXED_KEYS`), else
    through `c_name`."""
    return CParam(key, ctype, pointer, const, key if key in FIXED_KEYS else c_name(key))


@dataclass
class _Plan:
    """What the template needs, accumulated by the builders below."""

    params: list[CParam] = field(default_factory=list)
    registers: list[str] = field(default_factory=list)
    constants: list[Statement] = field(default_factory=list)  # of scalar parameters alone: one per thread
    streamed: list[Transfer] = field(default_factory=list)   # per-step loads issued `depth` steps early
    depth: int = 0                                           # steps of `streamed` in flight (0: none)
    staged: int = 0                                          # or: steps per block of `streamed` in registers
    setup: list[Transfer] = field(default_factory=list)
    loads: list[Transfer] = field(default_factory=list)
    body: list[Statement] = field(default_factory=list)
    stores: list[Transfer] = field(default_factory=list)
    finish: list[Transfer] = field(default_factory=list)
    # backward of a replayed derivation (`replay_steps`): segments of `segment` steps, last first; each replays
    # its steps forward from a checkpoint (`replay_setup`, then per step `replay_loads`, `replay_body`) into
    # `histories` ([segment][lanes] register arrays), then runs the usual step in reverse over them
    segment: int = 0
    histories: list[str] = field(default_factory=list)
    replay_setup: list[Transfer] = field(default_factory=list)
    replay_loads: list[Transfer] = field(default_factory=list)
    replay_body: list[Statement] = field(default_factory=list)


class NeuronKernel(CKernel):
    """A generated neuron kernel; launch arguments are named as in the module docstring."""

    template = "neuron.cu.j2"

    def __init__(self, kernel_name: str, plan: _Plan, options: KernelOptions, description: tuple[str, ...] = (),
                 checkpoint_steps: int = 0):
        super().__init__(kernel_name)
        self.plan, self.options, self.checkpoint_steps = plan, options, checkpoint_steps
        self.description = tuple(comment_text(line) for line in description)
        for param in plan.params:
            self.cparams[param.name] = param

    @property
    def lanes(self) -> int:
        return self.options.lanes

    @property
    def block(self) -> int:
        """Threads per block the kernel must be launched with (its shared ring is sized for them)."""
        return self.options.block

    def _context(self) -> dict[str, Any]:
        storage, native = self.options.dtype, self.options.native
        compute = storage if native else storage.compute
        loop = {"fptt": "forward", "bptt": "reverse"}.get(self.options.kernel, "none")
        return {"name": self.kernel_name, "headers": headers_for([storage]),
                "prelude": storage.prelude if native else "",
                "native": native, "words": self.lanes // storage.width if native else self.lanes,
                "params": [p.declaration(restrict=p.pointer) for p in self.cparams.values()], "core": "",
                "description": self.description, "lanes": self.lanes, "loop": loop,
                "compute_t": compute.ctype, "vector": self.options.vector,
                "vector_t": VECTOR_CTYPES.get(self.lanes * storage.torch_dtype.itemsize, ""),
                "unroll": f"#pragma unroll {self.options.unroll}" if self.options.unroll > 1 else "",
                "depth": self.plan.depth, "block": self.options.block,
                "staged": self.plan.staged, "staged_blocks": self.options.staged_blocks,
                "element_bytes": storage.torch_dtype.itemsize, "pair_copy": pair_copies(self.options),
                **{k: getattr(self.plan, k) for k in ("registers", "constants", "streamed", "setup", "loads", "body",
                                                     "stores", "finish", "segment", "histories", "replay_setup",
                                                     "replay_loads", "replay_body")}}


class _Builder:
    """Shared vocabulary of the forward and backward builders: names, loads, stores, printing."""

    def __init__(self, derivation: Derivation, options: KernelOptions):
        self.d, self.o, self.plan = derivation, options, _Plan()
        self.storage, self.native = options.dtype, options.native
        self.compute = self.storage if self.native else self.storage.compute
        # Tensor parameters and their gradients live in float (double for float64), whatever the arithmetic.
        self.param_dtype = self.storage.compute
        self.multi = options.kernel in ("fptt", "bptt")
        system = derivation.system
        self.tensor_params = dict(options.tensor_params)
        names = {system.x: "x[lane]", H: "ac_h", SPIKE: "ac_s", THRESHOLD: "ac_thr", SURROGATE_GRAD: "ac_sg",
                 GRAD_SPIKE: "ac_grad_s[lane]", _H_PREVIOUS: "ac_h_prev[lane]"}
        names |= {s: f"{c_name(s.name)}[lane]" for s in system.states}
        names |= {adjoint_symbol(s): f"{c_name(s.name, 'grad')}[lane]" for s in system.states}
        scalar = self.compute.broadcast or "{x}"  # scalars arrive as floats; native words need both lanes
        names |= {p: (f"{c_name(p.name, 'param')}[lane]" if p in self.tensor_params
                      else scalar.replace("{x}", c_name(p.name))) for p in system.params}
        self.printer = CudaPrinter(self.compute, names)
        self.temp_count = 0
        self.invariant_symbols = frozenset(system.params)
        # Invariants of these alone are the same for every lane: one register each, not one per lane. Per lane,
        # the coefficients of a discretised linear system (sqrt, expm1, sin, ...) were computed once per lane and
        # kept in as many registers: TwoCompartment's float32 forward with four lanes took 64 registers.
        self.lane_free = {p for p in system.params if p not in self.tensor_params}
        self.invariants: dict[sp.Expr, sp.Symbol] = {}
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
            value = self.compute.broadcast.replace("{x}", param.cname)
        else:  # rounded through the storage type, as an element of a tensor holding it would be
            value = self.storage.element_load.replace("{x}", self.storage.element_store.replace("{x}", param.cname))
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
                per_neuron = self.tensor_params[p]
                self.plan.setup.append(Transfer(f"parameter {p.name}", register, pointer,
                                                "ac_n0" if per_neuron else "0", element=self.param_dtype.element,
                                                vectorizable=False, per_lane=per_neuron,
                                                pair=self.storage.pair_floats))

    def scalar_params(self) -> None:
        for p in self.d.system.params:
            if p not in self.tensor_params:
                self.plan.params.append(kernel_param(p.name, self.param_dtype.ctype, False, True))

    # -- printing -------------------------------------------------------------------------------------
    def hoist(self, expr: sp.Expr) -> sp.Expr:
        """`expr` with its subexpressions of parameters alone (1/tau, exp(-1/tau_w), ...) replaced by registers
        computed once before the time loop. A division by a runtime value inside the loop stops the compiler
        from issuing later steps' loads early: at (T, N) = (1024, 16K) LIF's forward took 0.44 ms with
        `/ tau` in the loop and 0.16 ms with the reciprocal hoisted (H200, float32)."""
        found: dict[sp.Expr, sp.Symbol] = {}
        kinds: dict[sp.Basic, bool | None] = {}

        def kind(e: sp.Basic) -> bool | None:
            """True: parameters alone; False: depends on the step; None: no symbols (one pass, bottom up)."""
            if e not in kinds:
                if e.is_Symbol:
                    kinds[e] = e in self.invariant_symbols
                else:
                    parts = [kind(a) for a in e.args]
                    kinds[e] = False if False in parts else (True if True in parts else None)
            return kinds[e]

        def take(e: sp.Basic) -> None:
            """Hoist `e`, of parameters alone, or the largest expressions within it."""
            if isinstance(e, sp.Expr):
                if e.args and not (-e).is_Symbol:  # a negated parameter costs nothing in the loop
                    found[e] = self._invariant(e)
                return
            for arg in e.args:
                if kind(arg):
                    take(arg)

        def visit(e: sp.Basic) -> None:
            for arg in e.args:
                (take if kind(arg) else visit)(arg)
        (take if kind(expr) else visit)(expr)
        return expr.xreplace(found) if found else expr

    def _invariant(self, expr: sp.Expr) -> sp.Symbol:
        symbol = self.invariants.get(expr)
        if symbol is None:
            symbol = self.invariants[expr] = sp.Symbol(f"ac_k{len(self.invariants) + 1}", real=True)
            self._name_invariant(symbol, expr)
        return symbol

    def _name_invariant(self, symbol: sp.Symbol, value: sp.Expr) -> bool:
        """Name `symbol` for the printer: a register per thread where `value` is lane free, else one per lane.
        Returns whether it is lane free."""
        free = value.free_symbols <= self.lane_free
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

    def done(self) -> _Plan:
        """The plan, with the hoisted invariants computed after everything else is set up (parameters loaded).
        They share common subexpressions like the loop body does: printed one by one, the coefficients of a
        discretised linear system repeat each other and make sources that take nvcc minutes."""
        def names():
            for i in itertools.count(1):
                yield sp.Symbol(f"ac_kc{i}", real=True)
        replacements, reduced = sp.cse(list(self.invariants), symbols=names(), order="none")
        for symbol, value in replacements:
            self._compute_once("parameters only, once", symbol, value, self._name_invariant(symbol, value))
        for (expr, symbol), value in zip(self.invariants.items(), reduced):
            comment = f"{sp.sstr(expr)}, once" if _nodes(expr) <= 12 else "parameters only, once"
            self._compute_once(comment, symbol, value, symbol in self.lane_free)
        return self.plan

    def emit(self, exprs: list[sp.Expr], comment: str = "") -> list[str]:
        """Common subexpressions of `exprs` as declared temporaries; returns the printed reduced exprs."""
        exprs = [self.hoist(e) for e in exprs]

        def names():
            while True:
                self.temp_count += 1
                yield sp.Symbol(f"ac_c{self.temp_count}", real=True)
        replacements, reduced = sp.cse(exprs, symbols=names(), order="none")
        for i, (symbol, value) in enumerate(replacements):
            self.printer.names[symbol] = symbol.name
            self.plan.body.append(Statement(symbol.name, self.printer(value), comment=comment if i == 0 else ""))
        return [self.printer(e) for e in reduced]

    def statement(self, target: str, expr: sp.Expr | str, comment: str = "", declare: bool = True,
                  guard: str = "", otherwise: str = "") -> None:
        value = expr if isinstance(expr, str) else self.printer(self.hoist(expr))
        self.plan.body.append(Statement(target, value, declare, comment, guard, otherwise))


def _nodes(expr: sp.Basic, limit: int = 100) -> int:
    """The number of nodes of `expr`, counted up to `limit` (printing a large expression is slow)."""
    count = 0
    for _ in sp.preorder_traversal(expr):
        count += 1
        if count >= limit:
            break
    return count


def _forward(derivation: Derivation, options: KernelOptions) -> _Plan:
    b = _Builder(derivation, options)
    system, step = derivation.system, derivation.forward
    saving = options.save_for_backward
    b.pointer("x_seq", const=True)
    b.register("x", *(c_name(s.name) for s in system.states), "ac_out_spike")
    b.plan.loads.append(b.load("x", "x_seq", "ac_row", "input x[t]"))
    for s in system.states:
        b.plan.setup.append(b.initial(c_name(s.name), s.name))
    b.params_setup()
    b.pointer("spike_seq", const=False)
    if saving:
        b.pointer("h_seq", const=False)
        b.register("ac_out_h")
    charge, threshold = b.emit([step.charge, step.threshold], comment="charge and threshold")
    b.statement("ac_h", charge)
    b.statement("ac_thr", threshold)
    b.statement("ac_s", sp.Heaviside(H - THRESHOLD, 1), comment="fire")
    news = b.emit(list(step.new_states), comment="reset and state updates")
    for s, value in zip(system.states, news):
        b.statement(c_name(s.name, "next"), value)
    for s in system.states:
        b.statement(f"{c_name(s.name)}[lane]", c_name(s.name, "next"), declare=False)
    b.statement("ac_out_spike[lane]", "ac_s", declare=False)
    b.plan.stores.append(b.store("spike_seq", "ac_row", "ac_out_spike", "spike s[t]"))
    segment = replay_steps(derivation, options)
    if saving:
        if segment > 1 and b.storage is not b.compute:
            _h_stored_as_decided(b)
        else:
            b.statement("ac_out_h[lane]", "ac_h", declare=False)
        b.plan.stores.append(b.store("h_seq", "ac_row", "ac_out_h", "h[t], saved for backward"))
    for s, saved in zip(system.states, derivation.saved_states):
        if options.store_state_seq or (saved and saving and not segment):
            pointer = b.pointer(f"{s.name}_seq", const=False)
            b.plan.stores.append(b.store(pointer, "ac_row", c_name(s.name), f"{s.name}[t] after reset"))
        if saved and saving and segment:  # backward replays the steps in between
            exact = segment > 1  # a replay starts from the value forward had
            pointer = b.pointer(f"{s.name}_checkpoints", const=False, compute_type=exact)
            store = b.store(pointer, "ac_row" if segment == 1 else f"t / {segment} * N + ac_n0",
                            c_name(s.name), f"{s.name}[t] after reset: a checkpoint", compute_type=exact)
            b.plan.stores.append(dataclasses.replace(store, guard=f"t % {segment} == {segment - 1}")
                                 if segment > 1 else store)
    for s in system.states if options.final_states else ():
        pointer = b.pointer(f"{s.name}_final", const=False)
        b.plan.finish.append(b.store(pointer, "ac_n0", c_name(s.name), f"final {s.name}"))
    b.scalar_params()
    return b.done()


def _h_stored_as_decided(b: _Builder) -> None:
    """h for h_seq, rounded to the storage toward the side of the threshold forward's spike was decided on:
    to nearest, unless that crosses the threshold, then up (a spike) or down (none). Within one unit of the
    storage's last place of h either way, and a replay that compares it with the same threshold decides the
    same spike."""
    storage = b.storage
    load = storage.element_load

    def stored(rounding: str) -> str:
        return load.replace("{x}", rounding.replace("{x}", "ac_h"))
    b.printer.names[_H_STORED] = "ac_h_stored"
    b.statement("ac_h_stored", stored(storage.element_store), comment="h as stored, rounded to nearest")
    b.statement("ac_s_stored", sp.Heaviside(_H_STORED - THRESHOLD, 1))
    b.statement("ac_out_h[lane]", "ac_h", declare=False, guard="ac_s_stored == ac_s",
                otherwise=f"(ac_s != {b.compute.literal(0)}) ? {stored(storage.element_store_up)} : "
                          f"{stored(storage.element_store_down)}",
                comment="unless that decides the spike otherwise: then rounded toward the side h was on")


def _backward(derivation: Derivation, options: KernelOptions, surrogate_gradient: sp.Expr) -> _Plan:
    b = _Builder(derivation, options)
    system, step = derivation.system, derivation.backward
    b.pointer("grad_spike_seq", const=True)
    b.register("ac_grad_s", "ac_h_cur", "ac_out_grad_x")
    b.plan.loads.append(b.load("ac_grad_s", "grad_spike_seq", "ac_row", "gradient of s[t]"))
    for s in system.states:
        grad = c_name(s.name, "grad")
        b.register(grad)
        if options.grad_finals:
            pointer = b.pointer(f"grad_{s.name}_final", const=True)
            b.plan.setup.append(b.load(grad, pointer, "ac_n0", f"gradient of final {s.name}"))
        else:  # no loss term on the final states: the caller passes no zero tensors
            b.plan.setup.append(Transfer(f"gradient of final {s.name}: none", grad, "", "",
                                         b.compute.literal(0), vectorizable=False))
        if options.grad_state_seq:
            pointer = b.pointer(f"grad_{s.name}_seq", const=True)
            b.plan.loads.append(b.load(grad, pointer, "ac_row", f"gradient of {s.name}[t]", accumulate=True))
    b.pointer("h_seq", const=True)
    carry_h = derivation.recompute_membrane and b.multi
    segment = replay_steps(derivation, options)
    b.plan.segment = segment if segment > 1 else 0  # one step: the saved sequence's loop, read at t-1
    if carry_h:  # h[t-1] is loaded anyway to recompute v[t-1]; it becomes the next step's h[t]
        b.plan.setup.append(b.load("ac_h_cur", "h_seq", "(T - 1) * N + ac_n0", "h[T-1]"))
    elif b.plan.segment:  # loaded by the replay, kept for the reverse pass
        b.plan.histories.append("ac_hist_h")
        b.plan.replay_loads.append(b.load("ac_h_cur", "h_seq", "ac_row", "h[t]"))
        b.plan.loads.append(_recall("ac_h_cur", "ac_hist_h", "h[t], from the replay"))
    else:
        b.plan.loads.append(b.load("ac_h_cur", "h_seq", "ac_row", "h[t]"))
    _previous_states(b, derivation, "_checkpoints" if segment else "_seq")
    if step.needs_x:
        b.pointer("x_seq", const=True)
        b.register("x")
        b.plan.loads.append(b.load("x", "x_seq", "ac_row", "input x[t]"))
    b.params_setup()
    if segment:
        _replay(b, derivation)
    b.statement("ac_h", "ac_h_cur[lane]", comment="recompute threshold, spike and surrogate gradient")
    b.statement("ac_thr", system.threshold)
    b.statement("ac_s", sp.Heaviside(H - THRESHOLD, 1))
    b.statement("ac_sg", surrogate_gradient.subs(SURROGATE_INPUT, H - THRESHOLD))
    outputs = b.emit([step.grad_x, *step.grad_states, *step.grad_params], comment="adjoint of one step")
    grad_x, grad_states, grad_params = outputs[0], outputs[1:1 + len(system.states)], outputs[1 + len(system.states):]
    b.statement("ac_out_grad_x[lane]", grad_x, declare=False)
    for s, value in zip(system.states, grad_states):
        b.statement(c_name(s.name, "grad_prev"), value)
    for s in system.states:
        b.statement(f"{c_name(s.name, 'grad')}[lane]", c_name(s.name, "grad_prev"), declare=False)
    for p, value in zip(system.learnable, grad_params):
        acc = c_name(p.name, "acc")
        b.register(acc)
        b.plan.setup.append(Transfer(f"sum of d loss / d {p.name}", acc, "", "", b.compute.literal(0),
                                     vectorizable=False))
        b.statement(f"{acc}[lane]", b.compute.op("add", f"{acc}[lane]", value), declare=False)
    if carry_h:
        b.statement("ac_h_cur[lane]", "ac_h_prev[lane]", declare=False)
    b.pointer("grad_x_seq", const=False)
    b.plan.stores.append(b.store("grad_x_seq", "ac_row", "ac_out_grad_x", "gradient of x[t]"))
    for s in system.states if options.given_inits else ():  # a number given for all neurons has no gradient
        pointer = b.pointer(f"grad_{s.name}_init", const=False)
        b.plan.finish.append(b.store(pointer, "ac_n0", c_name(s.name, "grad"), f"gradient of {s.name}[-1]"))
    for p in system.learnable:
        pointer = b.pointer(f"grad_{p.name}", const=False, compute_type=True)
        b.plan.finish.append(b.store(pointer, "ac_n0", c_name(p.name, "acc"), f"per-neuron sum of d loss / d {p.name}",
                                     compute_type=True))
    b.scalar_params()
    return b.done()


def _previous_states(b: _Builder, derivation: Derivation, saved_as: str) -> None:
    """Registers holding each needed state of step t-1: loaded (from <state>`saved_as`), replayed, recomputed
    from h[t-1], or the initial value."""
    system = derivation.system
    for i, (s, needed) in enumerate(zip(system.states, derivation.backward.needs_states)):
        if not needed:
            continue
        state, initial = c_name(s.name), c_name(s.name, "init")
        b.register(state, initial)
        b.plan.setup.append(b.initial(initial, s.name))
        if not b.multi:
            b.statement(f"{state}[lane]", f"{initial}[lane]", declare=False, comment=f"{s.name} before the step")
        elif i == 0 and derivation.recompute_membrane:
            b.register("ac_h_prev")
            b.plan.loads.append(b.load("ac_h_prev", "h_seq", "ac_row - N", "h[t-1]", otherwise=b.compute.literal(0)))
            b.statement(f"{state}[lane]", previous_membrane(system, _H_PREVIOUS), declare=False,
                        comment=f"{s.name}[t-1] recomputed from h[t-1]", guard="t > 0", otherwise=f"{initial}[lane]")
        elif b.plan.segment:
            pointer, history = b.pointer(f"{s.name}_checkpoints", const=True, compute_type=True), c_name(s.name, "hist")
            b.plan.histories.append(history)
            checkpoint = b.load(state, pointer, f"(ac_s0 / {b.plan.segment} - 1) * N + ac_n0",
                                f"{s.name} before the segment: its checkpoint, or the initial value",
                                otherwise=f"{initial}[lane]", compute_type=True)
            b.plan.replay_setup.append(dataclasses.replace(checkpoint, guard="ac_s0 > 0", streamable=False))
            b.plan.loads.append(_recall(state, history, f"{s.name}[t-1], from the replay"))
        else:
            pointer = b.pointer(f"{s.name}{saved_as}", const=True)
            b.plan.loads.append(b.load(state, pointer, "ac_row - N", f"saved {s.name}[t-1]",
                                       otherwise=f"{initial}[lane]"))


def _recall(register: str, history: str, comment: str) -> Transfer:
    """register[lane] = its value at this step of the segment, kept by the replay."""
    return Transfer(comment, register, "", "", f"{history}[ac_k][lane]", vectorizable=False, streamable=False)


def _replay(b: _Builder, derivation: Derivation) -> None:
    """The replay's step (`_Plan`): the saved states before step t and h[t] into their histories, then the
    saved states' updates as forward ran them (the same expressions, printed alike: the replay rebuilds the
    values forward had, bit for bit, where the arithmetic is the storage's own)."""
    system = derivation.system
    kept = [(i, s) for i, (s, keep) in enumerate(zip(system.states, derivation.saved_states)) if keep]
    start = len(b.plan.body)
    for _, s in kept:
        b.statement(f"{c_name(s.name, 'hist')}[ac_k][lane]", f"{c_name(s.name)}[lane]", declare=False,
                    comment=f"{s.name}[t-1]" if s is kept[0][1] else "")
    b.statement("ac_hist_h[ac_k][lane]", "ac_h_cur[lane]", declare=False)
    b.statement("ac_h", "ac_h_cur[lane]", comment="threshold and spike, then the saved states' updates")
    b.statement("ac_thr", system.threshold)
    b.statement("ac_s", sp.Heaviside(H - THRESHOLD, 1))
    news = b.emit([derivation.forward.new_states[i] for i, _ in kept])
    for (_, s), value in zip(kept, news):
        b.statement(c_name(s.name, "next"), value)
    for _, s in kept:
        b.statement(f"{c_name(s.name)}[lane]", c_name(s.name, "next"), declare=False)
    b.plan.replay_body = b.plan.body[start:]
    del b.plan.body[start:]


def replay_steps(derivation: Derivation, options: KernelOptions) -> int:
    """Steps per segment of a multi-step kernel of a replayable derivation (`Derivation.replayable`): forward
    writes the saved states every `options.replay` steps, backward replays the others; 0 for other kernels.

    Checkpoints are kept in the arithmetic's type. In float16 and bfloat16 (float arithmetic) the replay sees h
    as stored, so forward stores it rounded toward the side of the threshold it was on (`_h_stored_as_decided`):
    the replay decides every spike as forward did. 1 (a checkpoint every step, as a saved sequence) with
    `replay` 0 or 1, or native half2 arithmetic. The name of what is saved stays the same for every dtype: the
    ops' outputs are named alike."""
    if not (derivation.replayable and options.kernel in ("fptt", "bptt")):
        return 0
    return options.replay if options.replay > 1 and not options.native else 1


def describe(spec_title: str, derivation: Derivation, options: KernelOptions) -> tuple[str, ...]:
    """Comment lines heading a kernel: what it is and the step equations it implements."""
    system, step = derivation.system, derivation.forward
    role = {"fptt": "forward through T steps", "bptt": "backward through T steps (reverse time loop)",
            "step-forward": "one forward step", "step-backward": "one backward step"}[options.kernel]
    arithmetic = options.dtype.compute.name
    lines = [spec_title, f"{options.kernel}: {role}; {options.dtype.name} storage, {arithmetic} arithmetic, "
             f"{system.reset} reset{', detach_reset' if derivation.detach_reset and 'backward' in role else ''}"]
    return tuple(lines) + _equations(system, step)


@functools.lru_cache(maxsize=1024)
def _equations(system: Any, step: Any) -> tuple[str, ...]:
    """The step's equations as comment lines (printed once per derivation: every variant repeats them)."""
    lines = [f"h = {sp.sstr(step.charge)}", f"threshold = {sp.sstr(step.threshold)}", "s = (h >= threshold)"]
    lines += [f"{s.name}' = {sp.sstr(e)}" for s, e in zip(system.states, step.new_states)]
    return tuple(line.replace("ac_h", "h").replace("ac_thr", "threshold").replace("ac_s", "s") for line in lines)


@functools.lru_cache(maxsize=1024)
def _text(part: Any) -> str:
    """repr of a derivation or a part of it, once: every variant of a spec names its kernel from it, and
    printing a large derivation takes a good part of a second."""
    return repr(part)


# Static shared memory one block may declare (larger needs an opt-in at launch).
SHARED_BYTES = 48 * 1024


def pipeline_depth(options: KernelOptions, streamed: int) -> int:
    """Steps of the streamed inputs kept in flight: `options.prefetch`, fewer where the ring would not fit in
    shared memory, none where an element cannot be copied asynchronously (cp.async moves 4, 8 or 16 bytes).

    Why shared memory and cp.async: a long loop over few neurons has few threads, each waiting on memory every
    step. Loads issued steps ahead into registers and converted at once did not help (ptxas waited on them at
    once; kept raw they do: `staged_steps`), while a ring of asynchronous copies waited on by count took a LIF
    forward at (T, N) = (1024, 16K) from 0.153 ms to 0.062 ms on an H200
    (`bench/results/2026-11-22-h200-async-ring/microbenchmark.txt`)."""
    element = options.dtype.torch_dtype.itemsize
    if options.prefetch <= 1 or not streamed or (not options.vector and element < 4 and not pair_copies(options)):
        return 0
    slot = 4 if pair_copies(options) else options.lanes * element
    return min(options.prefetch, SHARED_BYTES // (options.block * slot * streamed))


# 32-bit registers a thread may give the staged inputs (every streamed input's blocks ahead and the running one):
# long loops run few threads, so registers are plentiful, but not to spilling.
STAGED_WORDS = 128


def staged_steps(options: KernelOptions, streamed: list[Transfer]) -> int:
    """Steps per block of the register pipeline: `options.staged`, halved until the staged inputs fit in
    STAGED_WORDS registers; 0 (none) without the option, without streamed inputs or without vector accesses
    (an input stays in registers in its storage form, one vector per step, until its step converts it).

    Why registers after all: the ring in shared memory waits on its copies every step, and a long loop over few
    threads pays for that wait step after step. Loads issued a block of steps ahead, into registers that nothing
    reads until their step, took hand-written bfloat16 loops at (1024, 16K) on an H100 from the library's 60.5 to
    46-52 us (LIF forward) and from 116 to 70 us (a LIF-like backward;
    `bench/results/2026-11-25-h100-register-prefetch`); the generated kernels won 94 of 108 tunings of the core
    six at (1024, 16K) and (256, 64K) on an H200, by up to 1.49x (`bench/results/2026-11-25-h200-staged`). The
    raw values matter: converted on arrival, they make ptxas wait at once (as `pipeline_depth` found)."""
    if options.staged <= 1 or not streamed or not options.vector or not all(t.vectorizable for t in streamed):
        return 0
    words = options.lanes * options.dtype.torch_dtype.itemsize // 4 * len(streamed)  # a vector is 4 bytes at least
    steps = options.staged
    while steps > 1 and steps * words * (options.staged_blocks + 1) > STAGED_WORDS:
        steps //= 2
    return steps if steps > 1 else 0


def pair_copies(options: KernelOptions) -> bool:
    """Whether the prefetch ring copies, for one 2-byte neuron per thread, the aligned 4-byte pair holding it:
    half precision with one neuron per thread keeps twice the threads of one word per thread, which the long
    loops need. The caller guarantees what vector accesses need: N even and 4-byte-aligned tensors."""
    return not options.vector and options.lanes == 1 and options.dtype.torch_dtype.itemsize == 2


def build_kernel(spec_name: str, derivation: Derivation, options: KernelOptions,
                 surrogate_gradient: sp.Expr, description: tuple[str, ...] = ()) -> NeuronKernel:
    """The kernel `options.kernel` of a derivation; `surrogate_gradient` is an expression of SURROGATE_INPUT."""
    if options.kernel in ("fptt", "step-forward"):
        plan = _forward(derivation, options)
    else:
        plan = _backward(derivation, options, surrogate_gradient)
    streamed = [t for t in plan.loads if t.streamable]
    if options.kernel in ("fptt", "bptt") and not plan.segment:
        plan.depth = pipeline_depth(options, len(streamed))
        plan.staged = staged_steps(options, streamed)
    if plan.depth > 1 or plan.staged:
        plan.streamed, plan.loads = streamed, [t for t in plan.loads if not t.streamable]
    # Readable parts first; the digest tells apart variants that differ in anything else.
    # A forward kernel depends on detach_reset and the surrogate only through what it saves: leaving them out
    # of its name lets identical forward kernels share one name, one source and one compiled binary.
    forward = options.kernel in ("fptt", "step-forward")
    identity = ((_text(derivation.system), _text(derivation.forward), derivation.saved_states, options) if forward
                else (_text(derivation), options, surrogate_gradient))
    digest = hashlib.sha1(repr(identity).encode()).hexdigest()[:6]
    detach = "_detach" if derivation.detach_reset and not forward else ""
    kind = options.kernel.replace("-", "_")
    name = f"{kernel_stem(spec_name)}_{kind}_{options.dtype.name}_{derivation.system.reset}{detach}_{digest}"
    return NeuronKernel(name, plan, options, description, replay_steps(derivation, options))


# A kernel name is its stem and at most 42 more characters ('_step_backward_bfloat16_hard_detach_<digest>'), 63 in all.
KERNEL_STEM = 21


def kernel_stem(spec_name: str) -> str:
    """The start of a spec's kernel names: its name, or where that is longer than KERNEL_STEM, its first characters
    and a digest of the whole (specs whose names start alike still name their kernels apart)."""
    if len(spec_name) <= KERNEL_STEM:
        return spec_name
    digest = hashlib.sha1(spec_name.encode()).hexdigest()[:6]
    return f"{spec_name[:KERNEL_STEM - len(digest) - 1].rstrip('_')}_{digest}"
