"""The dtype table: lookup, literals, scalar packing, headers."""
from __future__ import annotations

import math
import re
import struct
import warnings

import numpy as np
import pytest
import torch

from autocuda.codegen.dtypes import (
    BFLOAT16,
    BINARY,
    DTYPES,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    UNARY,
    DType,
    get_dtype,
    headers_for,
)

ALL = list(DTYPES.values())
BY_TORCH = {torch.float32: FLOAT32, torch.float64: FLOAT64, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}


def test_table_holds_the_four_float_types():
    assert set(DTYPES) == {"float32", "float64", "float16", "bfloat16"}
    assert [(d.ctype, d.width) for d in (FLOAT32, FLOAT64, FLOAT16, BFLOAT16)] == [
        ("float", 1), ("double", 1), ("half2", 2), ("__nv_bfloat162", 2)]


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_lookup_by_name_every_alias_and_torch_dtype(dtype: DType):
    keys = [dtype.name, dtype.name.upper(), dtype.torch_dtype, dtype, *dtype.aliases]
    assert dtype.aliases, "each dtype should have at least one alias"
    for key in keys:
        assert get_dtype(key) is dtype, key


def test_the_seeds_spellings_resolve():
    expected = {"float": FLOAT32, "half2": FLOAT16, "half": FLOAT16, "double": FLOAT64, "bf16": BFLOAT16,
                "__nv_bfloat162": BFLOAT16, "fp16": FLOAT16, "fp32": FLOAT32}
    for name, dtype in expected.items():
        assert get_dtype(name) is dtype, name
    for torch_dtype, dtype in BY_TORCH.items():
        assert get_dtype(torch_dtype) is dtype


def test_aliases_are_unambiguous():
    names = [n for d in ALL for n in (d.name, *d.aliases)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("bad", ["float8", "int32", "", torch.int32, torch.complex64, None, 3.0])
def test_unknown_dtype_error_lists_the_known_names(bad):
    with pytest.raises(ValueError) as info:
        get_dtype(bad)
    message = str(info.value)
    assert repr(bad) in message
    for dtype in ALL:
        assert dtype.name in message
        for alias in dtype.aliases:
            assert alias in message


@pytest.mark.parametrize(("dtype", "value", "text"), [
    (FLOAT32, 1.0, "1.0f"), (FLOAT32, 1, "1.0f"), (FLOAT32, -0.25, "-0.25f"), (FLOAT32, 2.5e-8, "2.5e-08f"),
    (FLOAT64, 1.0, "1.0"), (FLOAT64, 1e-300, "1e-300"), (FLOAT64, -3, "-3.0"),
    (FLOAT16, 1.0, "__float2half2_rn(1.0f)"), (FLOAT16, -0.5, "__float2half2_rn(-0.5f)"),
    (BFLOAT16, 1.0, "__float2bfloat162_rn(1.0f)"), (BFLOAT16, 1e20, "__float2bfloat162_rn(1e+20f)"),
])
def test_literals(dtype: DType, value: float, text: str):
    assert dtype.literal(value) == text


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("value", [0.1, 1 / 3, -123456.789, 5e-7, 2.0**40])
def test_literal_reads_back_as_the_value(dtype: DType, value: float):
    """The number inside the literal is a C double literal that Python parses to exactly `value`."""
    if abs(value) > torch.finfo(dtype.torch_dtype).max:
        with pytest.raises(ValueError, match="out of range"):
            dtype.literal(value)
        return
    text = dtype.literal(value)
    inner = text.split("(")[-1].rstrip(")").removesuffix("f")
    assert float(inner) == value


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, np.float32("inf")])
def test_non_finite_literals_are_refused(dtype: DType, value: float):
    with pytest.raises(ValueError, match="non-finite"):
        dtype.literal(value)


@pytest.mark.parametrize(("dtype", "np_type"), [(FLOAT32, np.float32), (FLOAT64, np.float64)])
@pytest.mark.parametrize("value", [0.0, 1.5, -2.75, 0.1, 1e30])
def test_pack_scalar_word_types(dtype: DType, np_type: type, value: float):
    packed = dtype.pack_scalar(value)
    assert type(packed) is np_type
    assert packed == np_type(value)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_a_scalar_beyond_the_type_packs_as_torch_converts_it_without_a_warning(dtype: DType):
    """1e300 in float32 (or a 16-bit type) is an infinity, as the reference's conversion and the CUDA launch give; the
    host runner's packing printed NumPy's overflow warning at every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed = dtype.pack_scalar(-1e300)
    expected = torch.tensor(-1e300, dtype=torch.float64).to(dtype.torch_dtype).item()
    found = _halves(int(packed), dtype.torch_dtype)[0] if dtype.packed else float(packed)
    assert found == expected


def _halves(word: int, torch_dtype: torch.dtype) -> list[float]:
    """The two 16-bit lanes of a 32-bit word (lane 0 in the low half, as in memory on little-endian GPUs)."""
    raw = torch.frombuffer(bytearray(struct.pack("<I", word)), dtype=torch.int16)
    return raw.view(torch_dtype).float().tolist()


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 0.125, 3.0e4])
def test_pack_scalar_packed_types(dtype: DType, value: float):
    packed = dtype.pack_scalar(value)
    assert type(packed) is np.uint32
    expected = torch.tensor(value, dtype=dtype.torch_dtype).item()  # the value rounded to the type
    assert _halves(int(packed), dtype.torch_dtype) == [expected, expected]


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16], ids=lambda d: d.name)
def test_pack_scalar_rounds_to_the_element_type(dtype: DType):
    value = 1.0 + 2.0**-12  # not representable in either 16-bit type: rounds to 1.0
    assert _halves(int(dtype.pack_scalar(value)), dtype.torch_dtype) == [1.0, 1.0]


def test_headers_only_for_packed_types():
    assert FLOAT32.headers == () and FLOAT64.headers == ()
    assert FLOAT16.headers == ("#include <cuda_fp16.h>",)
    assert BFLOAT16.headers == ("#include <cuda_bf16.h>",)
    assert headers_for(["float32", torch.float64]) == []
    assert headers_for(["half2", "float32", torch.float16]) == ["#include <cuda_fp16.h>"]
    assert headers_for(["bf16", "half2", "bfloat16"]) == ["#include <cuda_bf16.h>", "#include <cuda_fp16.h>"]


def test_packed_types_carry_their_lane_helpers():
    for dtype in (FLOAT16, BFLOAT16):
        assert dtype.packed and dtype.prelude and dtype.to_float2 and dtype.from_floats
        assert dtype.ctype in dtype.prelude
    for dtype in (FLOAT32, FLOAT64):
        assert not dtype.packed and dtype.prelude == ""


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16], ids=lambda d: d.name)
def test_packed_helpers_are_defined_in_the_prelude(dtype: DType):
    """Every lane-wise helper an operation calls (ac_h2_tan, ac_bf2_expm1, ...) is defined by the prelude."""
    for name in (*UNARY, *BINARY, "if_else"):
        for prefix, function in re.findall(r"\b(ac_[a-z0-9]+)_(\w+)\(", dtype.op(name, "a", "b", "m")):
            assert (f"{prefix}_{function}(" in dtype.prelude
                    or f"{prefix.upper()}_LANEWISE({function}," in dtype.prelude), (name, function)


@pytest.mark.parametrize(("dtype", "text"), [(FLOAT32, "expm1f(x)"), (FLOAT64, "expm1(x)"),
                                             (FLOAT16, "ac_h2_expm1(x)"), (BFLOAT16, "ac_bf2_expm1(x)")])
def test_expm1_is_the_c_function_not_exp_minus_one(dtype: DType, text: str):
    assert dtype.op("expm1", "x") == text


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_unknown_operation_is_an_error(dtype: DType):
    with pytest.raises(ValueError, match="not defined"):
        dtype.op("frobnicate", "x")
