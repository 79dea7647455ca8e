"""Random draws for specs: Philox4x32-10 and its uniform and normal transforms, the same bits in torch and in C.

A draw is one number per (neuron, step, call site) of a spec's step (`randn()`, `rand()`: docs/spec-format.md).
It is made by a counter-based generator, so any thread may make any draw without a state to carry. One Philox call
serves a group of consecutive steps (G = 4 in float arithmetic, 2 in double: every bit of its four words is used):

    words = Philox4x32-10(counter = (neuron & 0xffffffff, neuron >> 32, (step >> log2 G) mod 2**32, site),
                          key = (seed lo, seed hi))

`step` is the call's first step (its offset) plus t; the step's place in its group is k = step mod G. The words
give G integers, in the arithmetic type of the kernel (float for float32, float16 and bfloat16; double for float64):
float: integer i = w[i] >> 8 (24 bits); double: integer i = (w[2i] >> 5)·2^26 + (w[2i + 1] >> 6) (53 bits). Then:

- uniform [0, 1): integer k · 2^-bits (exact);
- normal, float: by segments of the inverse normal CDF from word k alone (`codegen.normal_segments`): the sign from
  its top bit, |z| = -Φ⁻¹(q/2) with q = (2·(w mod 2^31) + 1)·2^-32, a cubic on one of 256 segments (q's octave and
  the next 3 bits of its mantissa) by three fused multiply-adds; within 6 units of 2^-24 (relative to max(1, |z|)).
- normal, double: Box-Muller on the group's pair p = k >> 1: r = sqrt(-2 log u1) with u1 = (1 + integer 2p)·2^-bits
  in (0, 1], and the turn j = integer (2p + 1); the draw is r·cos(2π j 2^-bits) for even k and r·sin(2π j 2^-bits)
  for odd k (the pair's two independent normals). The angle is reduced exactly on j (quadrant, then folded to
  [0, π/4]); log(u1) is e·ln2 + log(m) with m = frexp(u1) in [√½, √2) and log(m) from the series
  2s·Σ s^2k/(2k+1), s = (m-1)/(m+1); the series by Horner's rule with a multiply and an add (12 terms for the log,
  10 for cos and sin).

A kernel's time loop keeps each call site's group (its words; in double also the pair it last transformed) per
neuron, so a Philox call serves G steps (and a Box-Muller transform two), in either direction
(`cached_draw_function`).

Bitwise the same on the host runner, on any GPU and in torch: only integer operations, a table read, frexp (on the
bits, exact), correctly rounded + - * / and sqrt, and (float) fused multiply-adds, each rounded once (the C uses the
`_rn` intrinsics on the GPU; the host runner compiles with -ffp-contract=off, so only the written fmaf fuses, by
libm's correctly rounded fmaf; torch runs one operation per kernel, emulates fmaf exactly in float64 (`_fma`), and
takes the square root on the CPU from numpy, as torch's CPU sqrt is not correctly rounded).
Accuracy (tests/test_noise.py, against float64 math): float's normal within 6 units of 2^-24 (measured 3.7); double's
log within 8 units of 2^-53 relative to |log u| (measured 4.2), cos and sin within 8 such units of 1 (measured 6).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..base.tensor_cache import tensor_cache
from ..spec.draws import Draw
from . import normal_segments
from .ckernel import CKernel1D
from .dtypes import get_dtype
from .render import render

__all__ = ["KINDS", "philox4x32_10", "draw", "draws", "c_source", "Precision", "PRECISIONS", "seed_words",
           "DrawKernel", "Seed", "step_values", "draw_function", "cached_draw_function", "draw_cache_type",
           "draw_cache_init", "using_generator", "seed_source"]

KINDS = ("normal", "uniform")  # what a draw gives: standard normal, or uniform on [0, 1)
_MASK = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a·b for a 32-bit constant `a` and int64 tensor `b` of 32-bit words, without
    overflowing int64: b in 16-bit halves."""
    low_half, high_half = b & 0xFFFF, b >> 16
    p1, p2 = low_half * a, high_half * a            # < 2^48 each
    middle = p2 + (p1 >> 16)                         # a·b = middle·2^16 + (p1 & 0xffff)
    return middle >> 16, ((middle & 0xFFFF) << 16) | (p1 & 0xFFFF)


def philox4x32_10(counter: tuple[torch.Tensor, ...], key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 (Salmon et al., SC'11; Random123's constants) of 4 int64 tensors of 32-bit words: the 4 output
    words, as int64 tensors."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) & _MASK for c in counter)
    k0, k1 = key[0] & _MASK, key[1] & _MASK
    for round_ in range(ROUNDS):
        if round_:
            k0, k1 = (k0 + _PHILOX_W[0]) & _MASK, (k1 + _PHILOX_W[1]) & _MASK
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def seed_words(seed: int) -> tuple[int, int]:
    """A 64-bit seed as Philox's key (low word, high word)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed: an int in [0, 2**64), got {seed!r}")
    return seed & _MASK, seed >> 32


# -- the transforms' constants, rounded once per precision ---------------------------------------------------------
def _taylor(odd: bool, terms: int) -> tuple[Fraction, ...]:
    """The coefficients of cos (even) or sin(a)/a (odd) as series in a², highest first."""
    return tuple(Fraction((-1) ** k, math.factorial(2 * k + odd)) for k in reversed(range(terms)))


@dataclass(frozen=True)
class Precision:
    """The constants of the transforms in one arithmetic type, and how its uniforms are made."""

    name: str                      # "float" or "double"
    torch_dtype: torch.dtype
    bits: int                      # bits of a uniform's integer: 24 or 53
    log_terms: int                 # terms of the series of log(m) (Box-Muller; 0 where normals are by segments)
    trig_terms: int                # terms of the Taylor series of cos and sin (likewise)
    group_shift: int               # log2 of the steps one Philox call serves: its words hold 4 (float) or 2 integers
    fused: bool                    # polynomials by fused multiply-adds (float: torch emulates them exactly, `_fma`)
    normal: str                    # how a normal is made: "segments" (of one word, `normal_segments`) or "box-muller"

    @property
    def group(self) -> int:
        return 1 << self.group_shift

    def rounded(self, value: float | Fraction) -> float:
        return float(np.float32(float(value))) if self.name == "float" else float(value)

    @functools.cached_property
    def log_series(self) -> tuple[float, ...]:
        return tuple(self.rounded(Fraction(1, 2 * k + 1)) for k in reversed(range(self.log_terms)))

    @functools.cached_property
    def cos_series(self) -> tuple[float, ...]:
        return tuple(self.rounded(c) for c in _taylor(False, self.trig_terms))

    @functools.cached_property
    def sin_series(self) -> tuple[float, ...]:
        return tuple(self.rounded(c) for c in _taylor(True, self.trig_terms))

    @functools.cached_property
    def ln2_parts(self) -> tuple[float, float]:
        """ln 2 as hi + lo, hi with its low 12 mantissa bits clear (e·hi is exact for |e| < 2^12)."""
        hi = _clear_low_bits(math.log(2), self)
        lo = self.rounded(Fraction(_LN2_DIGITS) - Fraction(hi))
        return hi, lo

    @property
    def sqrt_half(self) -> float:
        return self.rounded(math.sqrt(0.5))

    @property
    def angle_step(self) -> float:
        """2π·2^-bits: a folded quadrant's integer r gives the angle r·angle_step (one rounding)."""
        return math.ldexp(self.rounded(2 * math.pi), -self.bits)

    def literal(self, value: float) -> str:
        return get_dtype("float32" if self.name == "float" else "float64").literal(value)


_LN2_DIGITS = "0.693147180559945309417232121458176568075500134360255254120680009493393621969694715605863326996"


def _clear_low_bits(value: float, precision: Precision) -> float:
    mantissa, exponent = math.frexp(value)
    keep = (24 if precision.name == "float" else 53) - 12
    return math.ldexp(math.floor(math.ldexp(mantissa, keep)), exponent - keep)


PRECISIONS = {"float": Precision("float", torch.float32, 24, 0, 0, 2, True, "segments"),
              "double": Precision("double", torch.float64, 53, 12, 10, 1, False, "box-muller")}


def precision_of(dtype: torch.dtype | str) -> Precision:
    """The arithmetic draws are made in for a storage dtype: double for float64, else float."""
    return PRECISIONS["double" if get_dtype(dtype).name == "float64" else "float"]


# -- the transforms in torch, operation for operation as the C ------------------------------------------------------
def _integer(words: tuple[torch.Tensor, ...], index: int, p: Precision) -> torch.Tensor:
    """Integer `index` (in [0, 2^bits)) of a group's words: words[index] (float) or words[2 index], words[2 index + 1]
    (double)."""
    if p.bits == 24:
        return words[index] >> 8
    return ((words[2 * index] >> 5) << 26) | (words[2 * index + 1] >> 6)


def _chosen(k: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """values[k] elementwise."""
    out = values[-1]
    for i in reversed(range(len(values) - 1)):
        out = torch.where(k == i, values[i], out)
    return out


def _fma(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """a·b + c in float32 rounded once, as the C's fmaf: the product is exact in float64, the sum is rounded to odd
    there (nearest, then one step towards the exact sum where it was inexact and the last bit even; TwoSum gives the
    error exactly), and rounding that to float32 is then correctly rounded (Boldo and Melquiond, 2008)."""
    product = a.double() * (b.double() if isinstance(b, torch.Tensor) else b)
    addend = c.double() if isinstance(c, torch.Tensor) else torch.full_like(product, c)
    total = product + addend
    back = total - product  # TwoSum: total + error == product + addend exactly
    error = (product - (total - back)) + (addend - back)
    even = (total.view(torch.int64) & 1) == 0
    towards = torch.where(error > 0, math.inf, -math.inf).to(total)
    total = torch.where((error != 0) & even, torch.nextafter(total, towards), total)
    return total.float()


def _horner(x: torch.Tensor, coefficients: tuple[float, ...], fused: bool) -> torch.Tensor:
    value = torch.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        value = _fma(value, x, c) if fused else value * x + c
    return value


def _log(u: torch.Tensor, p: Precision) -> torch.Tensor:
    """log(u) for u > 0, as the C's ac_log."""
    m, e = torch.frexp(u)
    low = m < p.sqrt_half
    m = torch.where(low, m * 2, m)
    e = (e - low.to(e.dtype)).to(u.dtype)
    s = (m - 1) / (m + 1)
    series = _horner(s * s, p.log_series, p.fused)
    hi, lo = p.ln2_parts
    if p.fused:
        return _fma(e, hi, _fma(s + s, series, e * lo))
    return e * hi + (e * lo + (s + s) * series)


def _cos_sin_turns(j: torch.Tensor, p: Precision) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of 2π j 2^-bits for integers j in [0, 2^bits), as the C's ac_draw_cos_sin_turns."""
    quarter = 1 << (p.bits - 2)
    quadrant, r = j >> (p.bits - 2), j & (quarter - 1)
    folded = r > quarter // 2
    r = torch.where(folded, quarter - r, r)
    a = r.to(p.torch_dtype) * p.angle_step
    x = a * a
    cos_a, sin_a = _horner(x, p.cos_series, p.fused), a * _horner(x, p.sin_series, p.fused)
    cos_t, sin_t = torch.where(folded, sin_a, cos_a), torch.where(folded, cos_a, sin_a)
    return (_chosen(quadrant, [cos_t, -sin_t, -cos_t, sin_t]),   # 2π j 2^-bits = quadrant·π/2 + a
            _chosen(quadrant, [sin_t, cos_t, -sin_t, -cos_t]))


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root: torch's on the CPU is not (it is off by an ulp now and then, in float32 and
    float64); numpy's is (the processor's own instruction). On CUDA torch's is (no fast math)."""
    if x.device.type != "cpu":
        return torch.sqrt(x)
    return torch.from_numpy(np.sqrt(x.detach().numpy()))


def _uniform(j: torch.Tensor, p: Precision) -> torch.Tensor:
    return j.to(p.torch_dtype) * math.ldexp(1.0, -p.bits)


@tensor_cache(maxsize=16)
def _segment_table(device: torch.device) -> torch.Tensor:
    return torch.tensor(normal_segments.segments(), dtype=torch.float32, device=device)


def _segment_normal(word: torch.Tensor) -> torch.Tensor:
    """The float normal of 32-bit words (int64 tensors), as the C's ac_draw_normal_word_f (`normal_segments`)."""
    r = ((word & 0x7FFFFFFF) << 1) | 1
    e = 32 - torch.frexp(r.double())[1].long()  # clz(r): r in [2^(31 - e), 2^(32 - e)), exact in double
    m = (r << e) & _MASK
    j = (m >> (31 - normal_segments.SEGMENT_BITS)) & ((1 << normal_segments.SEGMENT_BITS) - 1)
    mantissa = ((m << (normal_segments.SEGMENT_BITS + 1)) & _MASK) >> 9
    t = (mantissa | 0x3F800000).to(torch.int32).view(torch.float32) - 1.5
    c = _segment_table(word.device)[(e << normal_segments.SEGMENT_BITS) + j]
    z = _fma(_fma(_fma(c[..., 3], t, c[..., 2]), t, c[..., 1]), t, c[..., 0])
    return torch.where((word >> 31) != 0, -z, z)


def transform(kind: str, words: tuple[torch.Tensor, ...], k: torch.Tensor, p: Precision) -> torch.Tensor:
    """The draw of `kind` at place k (step mod G) of the group whose Philox words are `words`, in precision `p`."""
    if kind == "uniform":
        return _uniform(_chosen(k, [_integer(words, i, p) for i in range(p.group)]), p)
    if kind != "normal":
        raise ValueError(f"unknown kind of draw {kind!r}; expected one of {KINDS}")
    if p.normal == "segments":
        return _segment_normal(_chosen(k, list(words)))
    pair = k >> 1
    first = _chosen(pair, [_integer(words, 2 * q, p) for q in range(p.group // 2)])
    turn = _chosen(pair, [_integer(words, 2 * q + 1, p) for q in range(p.group // 2)])
    radius = _sqrt(_log(_uniform(first + 1, p), p) * -2.0)
    cos, sin = _cos_sin_turns(turn, p)
    return radius * torch.where((k & 1) == 0, cos, sin)


def draws(kind: str, seed: int, neurons: torch.Tensor | int, step: torch.Tensor | int, site: int,
          dtype: torch.dtype | str = torch.float32) -> torch.Tensor:
    """The draws of call site `site` for neuron indices `neurons` at `step` (broadcast against each other), in the
    arithmetic type of `dtype` (float64 for float64, else float32): what a kernel of that dtype draws."""
    p = precision_of(dtype)
    if kind not in KINDS:
        raise ValueError(f"unknown kind of draw {kind!r}; expected one of {KINDS}")
    key = seed_words(seed)
    n = torch.as_tensor(neurons, dtype=torch.int64)
    t = torch.as_tensor(step, dtype=torch.int64, device=n.device)
    n, t = torch.broadcast_tensors(n, t)
    counter = (n & _MASK, n >> 32, (t >> p.group_shift) & _MASK, torch.full_like(n, site & _MASK))
    return transform(kind, philox4x32_10(counter, key), t & (p.group - 1), p)


def draw(kind: str, seed: int, neuron: int, step: int, site: int, dtype: torch.dtype | str = torch.float32) -> float:
    """One draw, as a Python float."""
    return float(draws(kind, seed, neuron, step, site, dtype))


def draw_function(kind: str, precision: str) -> str:
    """The C function (of `c_source(precision)`) making a draw of `kind`: (neuron, step, site, seed lo, seed hi)."""
    return f"ac_draw_{kind}_{precision[0]}"


def cached_draw_function(kind: str, precision: str) -> str:
    """The C function making the same draw through a time loop's cache of one call site and neuron (its first
    argument, a `draw_cache_type`, initialised by `draw_cache_init`): (cache, neuron, step, site, seed lo, seed hi)."""
    return f"ac_draw_{kind}_cached_{precision[0]}"


def draw_cache_type(precision: str) -> str:
    return f"ac_draw_cache_{precision[0]}"


def draw_cache_init(precision: str) -> str:
    return f"ac_draw_cache_init_{precision[0]}"


@functools.lru_cache(maxsize=4)
def c_source(precision: str) -> str:
    """The C functions of the draws in one precision ("float" or "double"), for kernels that draw: Philox4x32-10
    and `draw_function`'s, behind include guards (a unit may hold several kernels' sources)."""
    p = PRECISIONS[precision]
    hi, lo = p.ln2_parts
    lit = p.literal
    mantissa_bits = p.bits - 1
    segments = [[lit(c) for c in segment] for segment in normal_segments.segments()] if p.normal == "segments" \
        else []
    return render("noise.cuh.j2", real=p.name, bits=p.bits, fused=p.fused, mantissa_bits=mantissa_bits,
                  segments=segments, segment_bits=normal_segments.SEGMENT_BITS,
                  segment_count=1 << normal_segments.SEGMENT_BITS,
                  exponent_bias=127 if p.name == "float" else 1023, mantissa_mask=(1 << mantissa_bits) - 1,
                  half_bits=0x3F000000 if p.name == "float" else 0x3FE0000000000000,  # 0.5's bits
                  m=[hex(m) for m in _PHILOX_M],
                  w=[hex(w) for w in _PHILOX_W], rounds=ROUNDS,
                  log_series=[lit(c) for c in p.log_series], cos_series=[lit(c) for c in p.cos_series],
                  sin_series=[lit(c) for c in p.sin_series], ln2_hi=lit(hi), ln2_lo=lit(lo),
                  sqrt_half=lit(p.sqrt_half), angle_step=lit(p.angle_step), one=lit(1.0), two=lit(2.0),
                  minus_two=lit(-2.0), unit=lit(math.ldexp(1.0, -p.bits)), group=p.group, shift=p.group_shift)


class DrawKernel(CKernel1D):
    """An element-wise kernel writing draws: out[i] = the draw of `kind` for neuron `neuron0 + i` at `step`, call
    site `site` (the same function a neuron kernel that draws calls; for tests and benchmarks of the generator).
    `out` is float32 (float arithmetic) or float64."""

    def __init__(self, kind: str, precision: str = "float"):
        if kind not in KINDS:
            raise ValueError(f"unknown kind of draw {kind!r}; expected one of {KINDS}")
        self.precision = PRECISIONS[precision]
        super().__init__(f"autocuda_draws_{kind}_{precision}")
        self.add_param(f"{precision} *", "out")
        for name in ("seed_lo", "seed_hi", "site"):
            self.add_param("unsigned int", name)
        for name in ("neuron0", "step"):
            self.add_param("long long", name)
        self.core = f"out[index] = {draw_function(kind, precision)}(neuron0 + index, step, site, seed_lo, seed_hi);"

    def _context(self) -> dict[str, Any]:
        context = super()._context()
        return context | {"prelude": context["prelude"] + c_source(self.precision.name)}

    def draws(self, seed: int, count: int, step: int = 0, site: int = 0, neuron0: int = 0,
              backend: str | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """`count` draws for neurons neuron0, neuron0 + 1, ...: as `autocuda.codegen.noise.draws` gives them."""
        out = torch.empty(count, dtype=self.precision.torch_dtype, device=device)
        lo, hi = seed_words(seed)
        self.simple_call(backend=backend, out=out, seed_lo=lo, seed_hi=hi, site=site, neuron0=neuron0, step=step)
        return out


@dataclass(frozen=True)
class Seed:
    """What a call that draws is given: the 64-bit seed and the step its first step counts as (`offset`); step t of
    the call draws at step offset + t."""

    seed: int
    offset: int = 0

    def __post_init__(self) -> None:
        seed_words(self.seed)
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or not 0 <= self.offset < 2**63:
            raise ValueError(f"offset: an int in [0, 2**63), got {self.offset!r}")

    def arguments(self) -> dict[str, int]:
        """The kernel arguments of a call that draws, by key (`cnames.DRAW_KEYS`)."""
        lo, hi = seed_words(self.seed)
        return {"ac_seed_lo": lo, "ac_seed_hi": hi, "ac_step0": self.offset}

    @classmethod
    def from_arguments(cls, values: Mapping[str, Any]) -> Seed | None:
        """The seed of a call's values holding its kernel arguments (`arguments`); None where they hold none."""
        if "ac_seed_lo" not in values:
            return None
        return cls(int(values["ac_seed_lo"]) | int(values["ac_seed_hi"]) << 32, int(values["ac_step0"]))

    @classmethod
    def from_torch(cls, generator: torch.Generator | None = None, offset: int = 0) -> Seed:
        """A seed taken from `generator`; where None, from the one `using_generator` set, else torch's default CPU
        generator (`torch.manual_seed` makes the draws repeatable)."""
        generator = generator if generator is not None else _GENERATOR.get()
        words = torch.randint(0, 2**32, (2,), dtype=torch.int64, generator=generator).tolist()
        return cls(words[0] | words[1] << 32, offset)


_GENERATOR: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar("autocuda_draws", default=None)


def seed_source() -> torch.Generator:
    """The generator calls that draw take their seeds from now: `using_generator`'s, else torch's default CPU one."""
    generator = _GENERATOR.get()
    return generator if generator is not None else torch.default_generator


@contextlib.contextmanager
def using_generator(generator: torch.Generator) -> Iterator[None]:
    """Within the block, calls that draw (layers, `autocuda.functional`) take their seeds from `generator` (a CPU
    torch.Generator) instead of torch's default one:

        with autocuda.codegen.noise.using_generator(torch.Generator().manual_seed(0)):
            spikes = layer(x)
    """
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        raise TypeError(f"using_generator: expected a CPU torch.Generator, got {generator!r}")
    token = _GENERATOR.set(generator)
    try:
        yield
    finally:
        _GENERATOR.reset(token)


def step_values(draws: Sequence[Draw], seed: Seed, t: int, like: torch.Tensor) -> dict[Any, torch.Tensor]:
    """The values of `draws` at step t of a call seeded by `seed`, for the neurons of `like` (one step's tensor; its
    flat index is the neuron's), in the arithmetic of like's dtype, on its device."""
    neurons = torch.arange(like.numel(), dtype=torch.int64).reshape(like.shape)
    return {d.symbol: draws_values(d, seed, neurons, t, like) for d in draws}


def draws_values(draw: Draw, seed: Seed, neurons: torch.Tensor, t: int, like: torch.Tensor) -> torch.Tensor:
    return draws(draw.kind, seed.seed, neurons, seed.offset + t, draw.site, like.dtype).to(like.device)
