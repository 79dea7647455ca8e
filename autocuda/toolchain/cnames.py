"""Names in generated C/C++/CUDA: how a user's names are spelled there, and which names the builder layer takes.

Generated kernels spell every name a user chose (a spec's parameters, states, ...) through `c_name`, behind a
prefix that no C/C++ keyword, no macro or name of a header we include, and no name the generator makes up starts
with; the generator's own names start with `ac_`. So a user's name can be anything `spec.names` allows, and no
list of C names has to be complete. The builder layer (`CKernel` and its kinds) takes kernel and parameter names
verbatim, as its user's own C: `identifier_problem` checks those. A neuron kernel's arguments are passed by key
(`codegen.neuron_kernel`); a spec may declare no name shaped like a key (`argument_key_problem`).
"""
from __future__ import annotations

import re

from ..spec.names import RESERVED_PREFIX

GENERATED_PREFIX = RESERVED_PREFIX  # the generator's own names: a prefix no name a spec declares starts with
USER_PREFIX = "usr_"  # not "u_": the C library declares u_int, u_char, ...


def c_name(user_name: str, role: str = "") -> str:
    """The C spelling of a user's name: `usr_<name>`; with a `role` (a word such as "grad" or "next", never holding
    "usr"), of what a kernel keeps for that name in that role: `ac_<role>_usr_<name>`. No two (name, role) pairs
    share a spelling, and none is a name the generator makes up otherwise."""
    if "usr" in role:
        raise ValueError(f"role {role!r}: a role must not hold 'usr' (spellings would be ambiguous)")
    spelled = USER_PREFIX + user_name
    return f"{GENERATED_PREFIX}{role}_{spelled}" if role else spelled


# Names a builder kernel's own names must not be (C/C++ keywords, CUDA built-ins and library names).
C_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t class compl const
constexpr const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern false
float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq
private protected public register reinterpret_cast restrict return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef typeid typename union unsigned using
virtual void volatile wchar_t while xor xor_eq
""".split())
CUDA_NAMES = frozenset("""
threadIdx blockIdx blockDim gridDim warpSize half half2 nv_bfloat16 nv_bfloat162 float2 float4 double2
int2 int4 printf malloc free memcpy memset assert exp expf expm1 expm1f log logf sqrt sqrtf pow powf fabs fabsf fmin
fminf fmax fmaxf sin sinf cos cosf tan tanf tanh tanhf atan atanf erf erff min max abs INFINITY NAN
char1 char2 char3 char4 uchar1 uchar2 uchar3 uchar4 short1 short2 short3 short4 ushort1 ushort2 ushort3 ushort4
int1 int3 uint1 uint2 uint3 uint4 long1 long2 long3 long4 ulong1 ulong2 ulong3 ulong4 longlong1 longlong2
ulonglong1 ulonglong2 float1 float3 double1 double3 double4 dim3 uint ushort uchar ulong
""".split())

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}\Z")
# A kernel's name becomes C text (symbols, #line file names) and a file name: a C identifier, nothing else.
KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}\Z")


def identifier_problem(name: object) -> str | None:
    """Why `name` cannot name a builder kernel or one of its parameters in C, or None if it can."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return "must be an ASCII identifier: a letter, then letters, digits or '_' (at most 63 characters)"
    if "__" in name:
        return "must not contain '__' (reserved for the compiler)"
    if name.startswith(GENERATED_PREFIX):
        return f"must not start with {GENERATED_PREFIX!r} (reserved for generated names)"
    if name in C_KEYWORDS:
        return "is a C/C++ keyword"
    if name in CUDA_NAMES:
        return "is a CUDA built-in or library name"
    return None


_COMMENT_UNSAFE = re.compile(r"[^ -~]|\\|\?\?|\*/")


def comment_text(text: str, limit: int = 200) -> str:
    """`text` made safe inside a `//` comment: printable ASCII only, no backslash (a line continuation would
    swallow the next line of code), no trigraphs, no `*/`; cut to `limit` characters."""
    return _COMMENT_UNSAFE.sub(" ", str(text))[:limit]


# The arguments of a kernel that draws (`spec.draws`): the seed's two words and the step of the call's first step.
DRAW_KEYS = ("ac_seed_lo", "ac_seed_hi", "ac_step0")
# Kernel argument keys (`codegen.neuron_kernel`) that hold no user's name; every other key is made from one, in a shape
# below: `<state>_init`, `<state>_seq`, `<state>_final`, `<state>_checkpoints`, `grad_<state or param>...`.
FIXED_KEYS = frozenset({"x_seq", "spike_seq", "h_seq", "grad_spike_seq", "grad_x_seq", "N", "T",
                        "ac_channels", "ac_inner", "ac_grad_x_scale", "ac_grad_x_shift", *DRAW_KEYS})
KEY_SUFFIXES = ("_init", "_seq", "_final", "_checkpoints")
KEY_PREFIXES = ("grad_",)


def argument_key_problem(name: str) -> str | None:
    """Why a spec cannot declare `name`: it is, or is shaped like, a kernel argument's key (callers pass arguments
    by key, so it would make two arguments one); None if it is not."""
    if name in FIXED_KEYS or name.endswith(KEY_SUFFIXES) or name.startswith(KEY_PREFIXES):
        return (f"is, or is shaped like, the name of a kernel argument ({', '.join(sorted(FIXED_KEYS))}; starting "
                f"with {', '.join(map(repr, KEY_PREFIXES))} or ending in {', '.join(map(repr, KEY_SUFFIXES))})")
    return None


def input_key(name: str) -> str:
    """The key of a step input's sequence (x_seq for x, else `<input>_seq`); its gradient's is `grad_` and this."""
    return f"{name}_seq"


def input_register(name: str) -> str:
    """The register a kernel keeps a step input's value at t in (x for x, else the input's C spelling)."""
    return "x" if name == "x" else c_name(name)
