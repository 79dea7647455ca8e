"""C/C++/CUDA names that generated code owns: nothing user-supplied may be called one of these."""
from __future__ import annotations

import re

C_KEYWORDS = frozenset("""
alignas alignof and asm auto bool break case catch char char16_t char32_t class const constexpr const_cast
continue decltype default delete do double dynamic_cast else enum explicit export extern false float for
friend goto if inline int long mutable namespace new noexcept not nullptr operator or private protected
public register reinterpret_cast restrict return short signed sizeof static static_assert static_cast
struct switch template this thread_local throw true try typedef typeid typename union unsigned using
virtual void volatile wchar_t while
""".split())
CUDA_NAMES = frozenset("""
threadIdx blockIdx blockDim gridDim warpSize half half2 nv_bfloat16 nv_bfloat162 float2 float4 double2
int2 int4 printf malloc free memcpy memset assert exp expf expm1 expm1f log logf sqrt sqrtf pow powf fabs fabsf fmin
fminf fmax fmaxf sin sinf cos cosf tan tanf tanh tanhf atan atanf erf erff min max abs INFINITY NAN
char1 char2 char3 char4 uchar1 uchar2 uchar3 uchar4 short1 short2 short3 short4 ushort1 ushort2 ushort3 ushort4
int1 int3 uint1 uint2 uint3 uint4 long1 long2 long3 long4 ulong1 ulong2 ulong3 ulong4 longlong1 longlong2
ulonglong1 ulonglong2 float1 float3 double1 double3 double4 dim3 uint ushort uchar ulong
""".split())
# Names the templates declare inside kernels.
GENERATED_NAMES = frozenset({"index", "numel", "N", "T", "t", "dt", "lane", "word"})
GENERATED_PREFIX = "ac_"
# Kernel parameters are named after states and parameters (<state>_init, <state>_seq, <state>_final,
# grad_<name>, x_seq, spike_seq, h_seq): a user name of these shapes could collide with one of them.
GENERATED_SUFFIXES = ("_init", "_seq", "_final")
GENERATED_PARAM_PREFIX = "grad_"

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}\Z")


def identifier_problem(name: object) -> str | None:
    """Why `name` cannot name something in generated C code, or None if it can."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return "must be an ASCII identifier: a letter, then letters, digits or '_' (at most 63 characters)"
    if name.startswith("__") or "__" in name:
        return "must not contain '__' (reserved for the compiler)"
    if name.startswith(GENERATED_PREFIX):
        return f"must not start with {GENERATED_PREFIX!r} (reserved for generated names)"
    if name in C_KEYWORDS:
        return "is a C/C++ keyword"
    if name in CUDA_NAMES:
        return "is a CUDA built-in or library name"
    if name in GENERATED_NAMES:
        return "is a name the generated kernels use"
    if name.endswith(GENERATED_SUFFIXES) or name.startswith(GENERATED_PARAM_PREFIX):
        return (f"must not start with {GENERATED_PARAM_PREFIX!r} or end with "
                f"{', '.join(map(repr, GENERATED_SUFFIXES))} (the generated kernels' parameters are named so)")
    return None


_COMMENT_UNSAFE = re.compile(r"[^ -~]|\\|\?\?|\*/")


def comment_text(text: str, limit: int = 200) -> str:
    """`text` made safe inside a `//` comment: printable ASCII only, no backslash (a line continuation would
    swallow the next line of code), no trigraphs, no `*/`; cut to `limit` characters."""
    return _COMMENT_UNSAFE.sub(" ", str(text))[:limit]
