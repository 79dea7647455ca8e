"""The dtype table: every fact about a CUDA number type lives here, once.

The emitters (`cfunction`), the sympy printer and the kernel builder all read these records; none of them
branches on a dtype name. A record describes the *word* a kernel thread handles: one float, one double,
or a pair of halves / bfloat16s packed in `half2` / `__nv_bfloat162` (so packed kernels move two neurons
per load and store).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from ..base.errors import LiteralError

# Operation spellings over C expressions, filled in by `fill`: {x}, {y}, {m} are operand texts, already
# parenthesised where needed by the caller (a spelling wraps its own result in parentheses); {one}, {zero}, {exp}
# and {p} are the dtype's own (`DType.constants`).
_SCALAR_OPS = {
    "add": "({x} + {y})",
    "sub": "({x} - {y})",
    "mul": "({x} * {y})",
    "div": "({x} / {y})",
    "neg": "(-{x})",
    "greater_equal": "({x} >= {y} ? {one} : {zero})",
    "greater_than": "({x} > {y} ? {one} : {zero})",
    "less_equal": "({x} <= {y} ? {one} : {zero})",
    "less_than": "({x} < {y} ? {one} : {zero})",
    "if_else": "({m} != {zero} ? {x} : {y})",
    "heaviside": "({x} >= {zero} ? {one} : {zero})",         # Θ(0) = 1: fires at equality
    "heaviside_strict": "({x} > {zero} ? {one} : {zero})",   # Θ(0) = 0: fires strictly above
    "sigmoid": "({one} / ({one} + {exp}(-{x})))",
    # Conditions for the printer's selections: C booleans here, 0/1 lane masks for packed types.
    "cond_ge": "({x} >= {y})", "cond_gt": "({x} > {y})", "cond_le": "({x} <= {y})", "cond_lt": "({x} < {y})",
    "cond_and": "({x} && {y})",
    "select": "({m} ? {x} : {y})",
    # A spec's min and max (the printer's folds) as torch's minimum and maximum: NaN where an operand is NaN (C's
    # fmin and fmax, the builder's `minimal` and `maximum`, give the other operand); defined by NAN_FOLDS
    "minimum_nan": "ac_minimum({x}, {y})",
    "maximum_nan": "ac_maximum({x}, {y})",
}
# The definitions of the scalar folds above, for float and double, once per translation unit (sources of several
# kernels are compiled together); `render` adds them to a source that calls one
NAN_FOLDS = """\
#ifndef AC_NAN_FOLDS
#define AC_NAN_FOLDS
__device__ __forceinline__ float ac_minimum(float a, float b) {
    return (a != a || b != b) ? a + b : (b < a ? b : a);
}
__device__ __forceinline__ float ac_maximum(float a, float b) {
    return (a != a || b != b) ? a + b : (b > a ? b : a);
}
__device__ __forceinline__ double ac_minimum(double a, double b) {
    return (a != a || b != b) ? a + b : (b < a ? b : a);
}
__device__ __forceinline__ double ac_maximum(double a, double b) {
    return (a != a || b != b) ? a + b : (b > a ? b : a);
}
#endif
"""
_FLOAT_FUNCS = {
    "exp": "expf", "expm1": "expm1f", "log": "logf", "sqrt": "sqrtf", "abs": "fabsf", "power": "powf",
    "sin": "sinf", "cos": "cosf", "tan": "tanf", "tanh": "tanhf", "atan": "atanf", "erf": "erff",
    "minimal": "fminf", "maximum": "fmaxf",
}
_DOUBLE_FUNCS = {
    "exp": "exp", "expm1": "expm1", "log": "log", "sqrt": "sqrt", "abs": "fabs", "power": "pow", "sin": "sin",
    "cos": "cos", "tan": "tan", "tanh": "tanh", "atan": "atan", "erf": "erf", "minimal": "fmin", "maximum": "fmax",
}
# Packed types: cuda_fp16.h / cuda_bf16.h overload these intrinsics for both half2 and __nv_bfloat162.
# Functions without a packed intrinsic go through float lane by lane, via helpers in the prelude.
_PACKED_OPS = {
    "add": "__hadd2({x}, {y})",
    "sub": "__hsub2({x}, {y})",
    "mul": "__hmul2({x}, {y})",
    "div": "__h2div({x}, {y})",
    "neg": "__hneg2({x})",
    "abs": "__habs2({x})",
    "exp": "h2exp({x})",
    "expm1": "{p}_expm1({x})",
    "log": "h2log({x})",
    "sqrt": "h2sqrt({x})",
    "sin": "h2sin({x})",
    "cos": "h2cos({x})",
    "power": "{p}_pow({x}, {y})",
    "tan": "{p}_tan({x})",
    "tanh": "{p}_tanh({x})",
    "atan": "{p}_atan({x})",
    "erf": "{p}_erf({x})",
    "minimal": "__hmin2({x}, {y})",
    "maximum": "__hmax2({x}, {y})",
    "minimum_nan": "__hmin2_nan({x}, {y})",
    "maximum_nan": "__hmax2_nan({x}, {y})",
    "greater_equal": "__hge2({x}, {y})",
    "greater_than": "__hgt2({x}, {y})",
    "less_equal": "__hle2({x}, {y})",
    "less_than": "__hlt2({x}, {y})",
    "if_else": "{p}_select({m}, {x}, {y})",
    "heaviside": "__hge2({x}, {zero})",
    "heaviside_strict": "__hgt2({x}, {zero})",
    "sigmoid": "h2rcp(__hadd2({one}, h2exp(__hneg2({x}))))",
    "cond_ge": "__hge2({x}, {y})", "cond_gt": "__hgt2({x}, {y})", "cond_le": "__hle2({x}, {y})",
    "cond_lt": "__hlt2({x}, {y})", "cond_and": "__hmul2({x}, {y})",
    "select": "{p}_select({m}, {x}, {y})",
}
UNARY = ("neg", "abs", "exp", "expm1", "log", "sqrt", "sin", "cos", "tan", "tanh", "atan", "erf", "heaviside",
         "heaviside_strict", "sigmoid")
BINARY = ("add", "sub", "mul", "div", "power", "minimal", "maximum",
          "greater_equal", "greater_than", "less_equal", "less_than")

# Lane-wise helpers for packed types: the functions CUDA has no packed intrinsic for, and a select that
# never multiplies the branch not taken (so an Inf there cannot turn into NaN).
_PACKED_PRELUDE = """\
#ifndef {P}_PRELUDE
#define {P}_PRELUDE
__device__ __forceinline__ {t} {p}_lanes(float a, float b) { return {pack}(a, b); }
__device__ __forceinline__ {t} {p}_select({t} m, {t} a, {t} b) {
    const float2 fm = {unpack}(m), fa = {unpack}(a), fb = {unpack}(b);
    return {p}_lanes(fm.x != 0.0f ? fa.x : fb.x, fm.y != 0.0f ? fa.y : fb.y);
}
__device__ __forceinline__ {t} {p}_pow({t} a, {t} b) {
    const float2 fa = {unpack}(a), fb = {unpack}(b);
    return {p}_lanes(powf(fa.x, fb.x), powf(fa.y, fb.y));
}
#define {P}_LANEWISE(fn, cfn) __device__ __forceinline__ {t} {p}_##fn({t} a) { \\
    const float2 fa = {unpack}(a); return {p}_lanes(cfn(fa.x), cfn(fa.y)); }
{P}_LANEWISE(expm1, expm1f)
{P}_LANEWISE(tan, tanf)
{P}_LANEWISE(tanh, tanhf)
{P}_LANEWISE(atan, atanf)
{P}_LANEWISE(erf, erff)
#undef {P}_LANEWISE
#endif
"""


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(spelling: str, **fields: str) -> str:
    """`spelling` with each named field ({x}, {p}, ...) replaced by its text, in one pass (a text filled in is
    never read again): the one way C text of the table, and of the kernels' transfers, takes its operands. Any
    other brace is C's own; a field not given is an error, fields the spelling does not name are ignored."""
    def field_text(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fields:
            raise KeyError(f"spelling {spelling!r} names the field {name!r}, which was not given")
        return fields[name]
    return _FIELD.sub(field_text, spelling)


@dataclass(frozen=True)
class DType:
    """One CUDA number type as a kernel thread sees it."""

    name: str                  # torch's name: float32, float64, float16, bfloat16
    ctype: str                 # C type of the word a thread loads (half2 for float16)
    element: str               # C type of one element
    width: int                 # elements per word
    torch_dtype: torch.dtype
    literal_format: str        # how a number prints: {v} is a valid C double literal
    headers: tuple[str, ...]   # includes needed where this type appears
    to_float2: str | None      # packed word -> float2; None for scalar words
    from_floats: str | None    # two floats -> packed word
    ops: MappingProxyType = field(repr=False)        # operation name -> spelling (`fill`)
    constants: MappingProxyType = field(repr=False)  # fields its ops name besides the operands ({one}, {p}, ...)
    prelude: str = field(default="", repr=False)
    aliases: tuple[str, ...] = ()
    # Storage with arithmetic in another type (half and bfloat16 compute in float by default):
    compute_type: DType | None = field(default=None, repr=False)   # the arithmetic's record; None: this one
    element_load: str = "{x}"           # one stored element -> compute type
    element_store: str = "{x}"          # compute type -> one stored element
    element_store_up: str = ""         # compute type -> the nearest stored element above it (or equal)
    element_store_down: str = ""       # ... below it (or equal)
    # Native packed arithmetic (a word of two lanes): building words and taking them apart.
    pair_elements: str = ""            # two stored elements {a}, {b} -> word
    pair_floats: str = ""              # two floats -> word
    halves: tuple[str, str] = ("", "")         # word -> its low / high stored element
    float_halves: tuple[str, str] = ("", "")   # word -> its low / high lane as float
    broadcast: str = ""                # one float {x} -> word with it in both lanes

    @property
    def compute(self) -> DType:
        return self.compute_type or self

    @property
    def packed(self) -> bool:
        return self.width > 1

    def literal(self, value: float) -> str:
        """A C expression of this word type holding `value` (in every lane)."""
        value = float(value)
        if not np.isfinite(value) or abs(value) > torch.finfo(self.torch_dtype).max:
            raise LiteralError(f"the constant {value} is non-finite or out of range for {self.name}")
        if value and not torch.tensor(value, dtype=self.torch_dtype).item():  # a nonzero number that would read 0
            raise LiteralError(f"the constant {value} is below the smallest {self.name} (it would read 0)")
        text = repr(value)
        if "e" not in text and "." not in text:
            text += ".0"
        return fill(self.literal_format, v=text)

    def pack_scalar(self, value: float) -> np.generic:
        """`value` as the bytes of one word, for passing a scalar parameter of this type by value; beyond the type's
        range, an infinity (as torch's conversion and the CUDA launch's give), without NumPy's warning."""
        if not self.packed:
            with np.errstate(over="ignore"):
                return np.dtype(str(self.torch_dtype).removeprefix("torch.")).type(value)
        pair = torch.tensor([value, value], dtype=self.torch_dtype)
        return np.uint32(int(pair.view(torch.int32).item()) & 0xFFFFFFFF)

    def op(self, name: str, x: str = "", y: str = "", m: str = "") -> str:
        """The C text of operation `name` on operand texts x, y (and mask m for if_else)."""
        try:
            spelling = self.ops[name]
        except KeyError:
            raise ValueError(f"operation {name!r} is not defined for dtype {self.name}") from None
        return fill(spelling, x=x, y=y, m=m, **self.constants)


def _scalar(name: str, ctype: str, torch_dtype: torch.dtype, literal: str, funcs: dict[str, str],
            aliases: tuple[str, ...] = ()) -> DType:
    """A one-lane type: operators from `_SCALAR_OPS`, functions from `funcs` (name -> C function)."""
    ops = {**_SCALAR_OPS, **{k: fn + "({x})" for k, fn in funcs.items() if k in UNARY},
           **{k: fn + "({x}, {y})" for k, fn in funcs.items() if k in BINARY}}
    one, zero = fill(literal, v="1.0"), fill(literal, v="0.0")
    return DType(name, ctype, ctype, 1, torch_dtype, literal, (), None, None, MappingProxyType(ops),
                 MappingProxyType({"one": one, "zero": zero, "exp": funcs["exp"]}), aliases=aliases)


def _packed(name: str, ctype: str, element: str, torch_dtype: torch.dtype, prefix: str, header: str,
            unpack: str, pack: str, broadcast: str, aliases: tuple[str, ...], to_float: str, from_float: str,
            pair: str, halves: tuple[str, str]) -> DType:
    """A two-lane type; `from_float` is the stem of the conversions rounding to nearest (_rn), up and down."""
    constants = {"one": f"{broadcast}(1.0f)", "zero": f"{broadcast}(0.0f)", "p": prefix}
    prelude = fill(_PACKED_PRELUDE, t=ctype, p=prefix, P=prefix.upper(), pack=pack, unpack=unpack)
    low, high = halves
    return DType(name, ctype, element, 2, torch_dtype, broadcast + "({v}f)", (header,), unpack, pack,
                 MappingProxyType(_PACKED_OPS), MappingProxyType(constants), prelude, aliases, FLOAT32_UNDER_HALF,
                 element_load=to_float + "({x})", element_store=f"{from_float}_rn" + "({x})",
                 element_store_up=f"{from_float}_ru" + "({x})", element_store_down=f"{from_float}_rd" + "({x})",
                 pair_elements=pair + "({a}, {b})", pair_floats=pack + "({a}, {b})",
                 halves=(low + "({x})", high + "({x})"), float_halves=("__low2float({x})", "__high2float({x})"),
                 broadcast=broadcast + "({x})")


FLOAT32 = _scalar("float32", "float", torch.float32, "{v}f", _FLOAT_FUNCS, ("float", "fp32", "f32"))
# The float arithmetic of kernels storing float16 / bfloat16: every value they store keeps 11 / 8 significant
# bits, so exp may be the hardware approximation `__expf` (within 2 + floor(1.173 |x|) units of float32's last
# place, CUDA Programming Guide; under 1e-5 relative for |x| < 60).
FLOAT32_UNDER_HALF = _scalar("float32", "float", torch.float32, "{v}f", {**_FLOAT_FUNCS, "exp": "__expf"})
FLOAT64 = _scalar("float64", "double", torch.float64, "{v}", _DOUBLE_FUNCS, ("double", "fp64", "f64"))
FLOAT16 = _packed("float16", "half2", "__half", torch.float16, "ac_h2", "#include <cuda_fp16.h>",
                  "__half22float2", "__floats2half2_rn", "__float2half2_rn", ("half2", "half", "fp16", "f16"),
                  "__half2float", "__float2half", "__halves2half2", ("__low2half", "__high2half"))
BFLOAT16 = _packed("bfloat16", "__nv_bfloat162", "__nv_bfloat16", torch.bfloat16, "ac_bf2",
                   "#include <cuda_bf16.h>", "__bfloat1622float2", "__floats2bfloat162_rn",
                   "__float2bfloat162_rn", ("nv_bfloat162", "__nv_bfloat162", "bf16", "bfloat162"),
                   "__bfloat162float", "__float2bfloat16", "__halves2bfloat162", ("__low2bfloat16", "__high2bfloat16"))

# Integer pointer and scalar parameters of hand-written kernels (index arrays, counts, masks).
INTEGER_CTYPES: MappingProxyType = MappingProxyType({
    "int": (torch.int32, np.int32), "unsigned int": (torch.int32, np.uint32),
    "long long": (torch.int64, np.int64), "int64_t": (torch.int64, np.int64),
    "unsigned char": (torch.uint8, np.uint8), "bool": (torch.bool, np.bool_),
})
DTYPES: MappingProxyType = MappingProxyType({d.name: d for d in (FLOAT32, FLOAT64, FLOAT16, BFLOAT16)})
_LOOKUP = {**{d.name: d for d in DTYPES.values()},
           **{a: d for d in DTYPES.values() for a in d.aliases},
           **{d.torch_dtype: d for d in DTYPES.values()}}


def get_dtype(dtype: Any) -> DType:
    """The record for a dtype given as a DType, a torch.dtype, or a name ('float32', 'half2', ...)."""
    if isinstance(dtype, DType):
        return dtype
    key = dtype.lower() if isinstance(dtype, str) else dtype
    try:
        return _LOOKUP[key]
    except (KeyError, TypeError):
        names = ", ".join(sorted(k for k in _LOOKUP if isinstance(k, str)))
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of: {names}") from None


def headers_for(dtypes: Any) -> list[str]:
    """The include lines needed by kernels using these dtypes, each once, in a stable order."""
    seen: dict[str, None] = {}
    for d in dtypes:
        for h in get_dtype(d).headers:
            seen[h] = None
    return list(seen)
