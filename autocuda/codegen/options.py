"""The records a neuron kernel is made of: its options, the plan the builders fill, and the rules that size its
loop schedule (segments of replayed steps, the shared-memory ring, the register stages)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import sympy as sp

from ..spec.derive import Derivation
from .broadcast import BROADCASTS, PER_CHANNEL, Broadcast
from .ckernel import CParam
from .dtypes import DType, fill, get_dtype

KERNELS = ("fptt", "bptt", "step-forward", "step-backward")
MULTI_STEP = ("fptt", "bptt")
VECTOR_CTYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}  # bytes of one aligned access -> C type

# Steps between checkpoints of replayed states, by default: forward writes 1/K of the saved sequence, backward
# keeps two [K][lanes] register arrays per thread. Long loops over few neurons take more (`runtime.neuron`).
REPLAY_STEPS = 8
# Static shared memory one block may declare (larger needs an opt-in at launch).
SHARED_BYTES = 48 * 1024
# 32-bit registers a thread may give its staged inputs: long loops run few threads, but must not spill.
STAGED_WORDS = 128
# What a BPTT kernel stores (`KernelOptions.gradients`): every gradient; the per-channel sums alone; or every other
# gradient, the input's with a per-channel term c1[c] * x + c0[c] added (the second of two passes, between which
# the caller turns the sums into c1 and c0: a BatchNorm's statistics' term)
GRADIENTS = ("all", "sums", "corrected")
# The layout's numbers a kernel is generated for, (least, most) each: a block launches at most 1024 threads; more
# lanes or unrolling than 64 only grows the source and the compile (prefetch is cut to fit SHARED_BYTES, staged to
# STAGED_WORDS); 0 lanes: the dtype's word width
LAYOUT_BOUNDS = {"lanes": (0, 64), "unroll": (1, 64), "prefetch": (0, 1 << 16), "staged": (0, 1 << 16),
                 "staged_blocks": (1, 64), "block": (1, 1024)}
MAX_REPLAY = 1024  # backward keeps a segment of replayed states in two [replay][lanes] register arrays per thread


@dataclass(frozen=True)
class KernelOptions:
    """Everything besides the derivation that changes a kernel's text."""

    kernel: str                                          # one of KERNELS
    dtype: DType
    tensor_params: tuple[tuple[sp.Symbol, Broadcast], ...] = ()  # runtime tensors: (symbol, how it spreads)
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
    gradients: str = "all"                               # what BPTT stores: one of GRADIENTS

    def __repr__(self) -> str:
        """The dataclass's repr, without `gradients` where it is "all" (kernel names are digests of it)."""
        shown = [f for f in fields(self) if not (f.name == "gradients" and self.gradients == "all")]
        return f"KernelOptions({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {KERNELS}")
        for name, (least, most) in LAYOUT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise ValueError(f"{name}: an int from {least} to {most}, got {value!r}")
        for name in ("vector", "native"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: True or False, got {getattr(self, name)!r}")
        if self.prefetch > 1 and self.staged > 1:
            raise ValueError("prefetch (a ring in shared memory) and staged (registers) are two ways of loading "
                             f"ahead: give one (got prefetch={self.prefetch}, staged={self.staged})")
        if self.gradients not in GRADIENTS:
            raise ValueError(f"gradients: expected one of {GRADIENTS}, got {self.gradients!r}")
        if self.gradients != "all" and (self.kernel != "bptt" or not self.per_channel):
            raise ValueError(f"gradients={self.gradients!r}: a BPTT kernel with per-channel parameters only (got a "
                             f"{self.kernel!r} kernel{'' if self.per_channel else ' without per-channel parameters'})")
        if isinstance(self.replay, bool) or not isinstance(self.replay, int) or not 0 <= self.replay <= MAX_REPLAY:
            raise ValueError(f"replay: steps per checkpoint, an int from 0 to {MAX_REPLAY} (0 or 1: every step), got "
                             f"{self.replay!r}")
        object.__setattr__(self, "dtype", get_dtype(self.dtype))
        for symbol, kind in self.tensor_params:
            if kind not in BROADCASTS or type(kind) not in (bool, str):
                raise ValueError(f"tensor parameter {symbol}: broadcast kind {kind!r} is none of {BROADCASTS}")
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

    @property
    def per_channel(self) -> bool:
        """Some tensor parameter holds one value per channel (the kernel takes CHANNEL_KEYS)."""
        return any(kind == PER_CHANNEL for _, kind in self.tensor_params)

    @property
    def multi_step(self) -> bool:
        return self.kernel in MULTI_STEP

    @property
    def forward(self) -> bool:
        return self.kernel in ("fptt", "step-forward")


@dataclass(frozen=True)
class Transfer:
    """Moving values between memory and a register array, in two phases through a staging array of elements:
    fetch (vector or element by element) then convert, or convert then write.

    Conversions are spellings filled by `dtypes.fill`: `value` converts one element {x} to or from the compute
    type; with native packed arithmetic `pair` builds a word from two elements {a}, {b} and `halves` take one
    word {x} apart. Where `pointer` is empty nothing is read: `value` is the register's value itself. `guard`
    (a C condition) gives every register `otherwise` when false.
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
    channel_sum: bool = False    # a store adding each lane's value into its channel's element (`CHANNEL_RUN`)
    group_sum: bool = False      # a store of one sum per group of neurons (`broadcast.GRADIENT_GROUP`)
    pair: str = ""
    halves: tuple[str, str] = ("", "")

    @property
    def element_ref(self) -> str:
        return f"{self.pointer}[{self.offset} + lane]" if self.per_lane else f"{self.pointer}[{self.offset}]"

    def lane_value(self, element: str) -> str:
        """The C value moved for one lane, given the text of the element (or register) on the other side."""
        return fill(self.value, x=element)

    def pair_value(self, low: str, high: str) -> str:
        return fill(self.pair, a=low, b=high)

    def half_value(self, which: int, word: str) -> str:
        return fill(self.halves[which], x=word)


@dataclass(frozen=True)
class Statement:
    """`target = value;` (declared const when `declare`); with a `guard`, `otherwise` where it is false."""

    target: str
    value: str
    declare: bool = True
    comment: str = ""
    guard: str = ""
    otherwise: str = ""


@dataclass
class KernelPlan:
    """What the schedule emitter frames, accumulated by the builders."""

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
    draws: str = ""  # the arithmetic ("float", "double") of the step's random draws; "" where it makes none
    draw_caches: list[str] = field(default_factory=list)  # per call site of a time loop: its groups' cache, per lane


def replay_steps(derivation: Derivation, options: KernelOptions) -> int:
    """Steps per segment of a multi-step kernel of a replayable derivation (`Derivation.replayable`): forward
    writes the saved states every `options.replay` steps, backward replays the others; 0 for other kernels.

    Checkpoints are kept in the arithmetic's type. In float16 and bfloat16 (float arithmetic) the replay sees h
    as stored, which forward rounds toward the side of the threshold it was on, as for every backward
    (`kernel_plans.h_stored_as_decided`): the replay decides every spike as forward did. 1 (a checkpoint every
    step, as a saved sequence) with `replay` 0 or 1, or native half2 arithmetic. The name of what is saved stays
    the same for every dtype: the ops' outputs are named alike. A replayed charge (`Derivation.charge_replayed`)
    keeps every checkpoint in float, one every `replay` steps (every step for 0 or 1), and refuses native
    arithmetic."""
    if not (derivation.replayable and options.multi_step):
        return 0
    if derivation.charge_replayed:  # no h saved: backward replays every step, from checkpoints in float
        if options.native:
            raise ValueError("a replayed charge needs checkpoints exact in float arithmetic: native packed "
                             "arithmetic (native=True) keeps none")
        return max(options.replay, 1)
    return options.replay if options.replay > 1 and not options.native else 1


def pipeline_depth(options: KernelOptions, streamed: int) -> int:
    """Steps of the streamed inputs kept in flight in a ring of asynchronous copies in shared memory:
    `options.prefetch`, fewer where the ring would not fit in SHARED_BYTES, none where an element cannot be
    copied asynchronously (cp.async moves 4, 8 or 16 bytes). A long loop over few neurons has few threads, each
    waiting on memory every step: copies issued steps ahead and waited on by count keep memory busy."""
    element = options.dtype.torch_dtype.itemsize
    if options.prefetch <= 1 or not streamed or (not options.vector and element < 4 and not pair_copies(options)):
        return 0
    slot = 4 if pair_copies(options) else options.lanes * element
    return min(options.prefetch, SHARED_BYTES // (options.block * slot * streamed))


def staged_steps(options: KernelOptions, streamed: list[Transfer]) -> int:
    """Steps per block of the register pipeline: `options.staged`, halved until the staged inputs fit in
    STAGED_WORDS registers; 0 (none) without the option, without streamed inputs or without vector accesses.
    An input stays in registers in its storage form, one vector per step, until its step converts it: converted
    on arrival, it would make the compiler wait for the load at once."""
    if options.staged <= 1 or not streamed or not options.vector or not all(t.vectorizable for t in streamed):
        return 0
    words = options.lanes * options.dtype.torch_dtype.itemsize // 4 * len(streamed)  # a vector is 4 bytes at least
    steps = options.staged
    while steps > 1 and steps * words * (options.staged_blocks + 1) > STAGED_WORDS:
        steps //= 2
    return steps if steps > 1 else 0


def pair_copies(options: KernelOptions) -> bool:
    """Whether the prefetch ring copies, for one 2-byte neuron per thread, the aligned 4-byte pair holding it:
    half precision with one neuron per thread keeps twice the threads of one word per thread, which long loops
    need. The caller guarantees what vector accesses need: N even and 4-byte-aligned tensors."""
    return not options.vector and options.lanes == 1 and options.dtype.torch_dtype.itemsize == 2
