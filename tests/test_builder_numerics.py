"""What the builder's kernels compute, on the host runner, in every dtype: cfunction emitters on edge values (zeros
of both signs, NaN, infinities, the dtype's extremes) against torch, and CKernel1D / CKernel2D launches (T = 0, odd
N of packed words, arguments that are one tensor) against plain torch loops."""
from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from conftest import compile_launched

from autocuda import CKernel1D, CKernel2D, cfunction, get_dtype
from autocuda.toolchain.host import cxx

pytestmark = pytest.mark.skipif(cxx.missing() is not None, reason=str(cxx.missing()))
DTYPES = ("float32", "float64", "float16", "bfloat16")
PACKED = ("float16", "bfloat16")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit, the sign of zero included; any NaN matches any NaN."""
    same = (_bits(got) == _bits(expected)) | (got.isnan() & expected.isnan())
    bad = (~same).nonzero().flatten()[:6].tolist()
    assert not bad, [(i, got[i].item(), expected[i].item()) for i in bad]


# -- emitters ---------------------------------------------------------------------------------------------------
def _edge_pairs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair (x, y) of the dtype's edge values."""
    info = torch.finfo(dtype)
    values = [0.0, -0.0, info.smallest_normal / 4, -info.smallest_normal, info.max, -info.max, math.inf, -math.inf,
              math.nan, 1.0, -2.5, 0.5]
    pairs = list(itertools.product(values, values))
    return torch.tensor([p[0] for p in pairs], dtype=dtype), torch.tensor([p[1] for p in pairs], dtype=dtype)


@functools.cache
def emitters_kernel(dtype: str) -> CKernel1D:
    """minimal, maximum and sigmoid of x, y in one kernel of the dtype's words."""
    d = get_dtype(dtype)
    kernel = CKernel1D(f"numerics_{d.name}")
    for name in ("x", "y"):
        kernel.add_param(f"const {d.ctype} *", name)
    for name in ("lo", "hi", "sg"):
        kernel.add_param(f"{d.ctype} *", name)
    kernel.core = "\n".join([cfunction.minimal("lo[index]", "x[index]", "y[index]", dtype=d),
                             cfunction.maximum("hi[index]", "x[index]", "y[index]", dtype=d),
                             cfunction.sigmoid("sg[index]", "x[index]", 1.0, dtype=d)])
    return kernel


def run_emitters(dtype: str) -> dict[str, torch.Tensor]:
    """The emitters kernel over the edge pairs, and (x only) every finite value of a 16-bit dtype."""
    d = get_dtype(dtype)
    x, y = _edge_pairs(d.torch_dtype)
    if d.packed:
        every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(d.torch_dtype)
        every = every[every.isfinite()]
        x, y = torch.cat([x, every]), torch.cat([y, torch.zeros_like(every)])
    out = {name: torch.empty_like(x) for name in ("lo", "hi", "sg")}
    emitters_kernel(dtype).simple_call(x=x, y=y, backend="host", **out)
    return {"x": x, "y": y, **out}


@pytest.fixture(scope="module")
def emitted(compiled: int) -> dict[str, dict[str, torch.Tensor]]:
    return {dtype: run_emitters(dtype) for dtype in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES)
def test_minimal_and_maximum_give_the_other_operand_of_a_nan(emitted, dtype: str):
    """minimal / maximum are C's fmin / fmax in every dtype (docs/builder.md): a NaN gives the other operand, as
    torch.fmin / torch.fmax (not torch.minimum), NaN only of two NaNs; of +0 and -0 either zero may come back."""
    r = emitted[dtype]
    pairs = _edge_pairs(get_dtype(dtype).torch_dtype)[0].numel()
    x, y = r["x"][:pairs].double(), r["y"][:pairs].double()
    zeros = (x == 0) & (y == 0)
    for got, fn in ((r["lo"][:pairs], torch.fmin), (r["hi"][:pairs], torch.fmax)):
        expected = fn(x, y).to(got.dtype)  # torch's own bfloat16 fmin/fmax give NaN: compared in float64
        assert_same(got[~zeros], expected[~zeros])
        assert (got[zeros] == 0).all()


@pytest.mark.parametrize("dtype", ("float32", "float64", "bfloat16"))
def test_sigmoid_matches_torch_within_two_units_of_the_last_place(emitted, dtype: str):
    r = emitted[dtype]
    x, got = r["x"], r["sg"]
    expected = torch.sigmoid(x.double()).to(x.dtype)
    # Below the smallest normal, torch's own float32 sigmoid (1 / (1 + exp(-x))) is 0 as the kernel's is
    tiny = expected.abs() < torch.finfo(x.dtype).smallest_normal
    ulps = (_bits(got).long() - _bits(expected).long()).abs()
    assert (ulps[~tiny & ~x.isnan()] <= 2).all() and got[x.isnan()].isnan().all()
    assert (got[tiny] >= 0).all() and (got[tiny] <= torch.finfo(x.dtype).smallest_normal).all()


@pytest.mark.xfail(strict=True, reason="float16 packed arithmetic rounds each operation to half: exp(-x) overflows to "
                                       "inf below x = -11.09, so 1 / (1 + exp(-x)) is 0 where torch gives up to "
                                       "1.5e-5; a fix computes packed sigmoid lane by lane in float (a prelude "
                                       "helper, which the native neuron kernels' pinned text includes)")
def test_float16_sigmoid_does_not_underflow_where_torch_gives_a_value(emitted):
    r = emitted["float16"]
    x, got = r["x"], r["sg"]
    expected = torch.sigmoid(x.float()).half()
    window = (x > -16) & (x < -11.1)
    assert ((got[window] - expected[window]).abs() <= 2 ** -24).all(), got[window][:4].tolist()


# -- CKernel2D with T = 0 ---------------------------------------------------------------------------------------
@functools.cache
def suffix_sums(dtype: str) -> CKernel2D:
    """docs/builder.md's sum_and_scan (reverse), in `dtype`'s words."""
    d = get_dtype(dtype)
    kernel = CKernel2D(f"suffix_sums_{d.name}", reverse=True)
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"{d.ctype} *", "y")
    kernel.add_param(f"{d.ctype} *", "out")
    kernel.pre_core = f"{d.ctype} acc = {cfunction.constant(None, 0.0, dtype=d)};"
    kernel.core = cfunction.add("acc", "acc", "x[t]", dtype=d) + "\ny[t] = acc;"
    kernel.post_core = "out[index] = acc;"
    return kernel


@pytest.mark.parametrize("dtype", ("float32", "float16"))
@pytest.mark.parametrize("T", [0, 1, 5])
def test_post_core_runs_also_over_zero_steps(dtype: str, T: int):
    """With T = 0 no kernel was launched: post_core never wrote the per-neuron sums, which kept whatever the output
    held (torch's x.sum(0) over no steps is 0)."""
    tdt = get_dtype(dtype).torch_dtype
    x = torch.arange(T * 7, dtype=tdt).reshape(T, 7) / 8  # N = 7: odd, a padded word in float16
    y, out = torch.empty_like(x), torch.full((7,), 7.0, dtype=tdt)
    suffix_sums(dtype).simple_call(x=x, y=y, out=out, backend="host")
    torch.testing.assert_close(y, x.flip(0).cumsum(0).flip(0))
    torch.testing.assert_close(out, x.sum(0))


# -- arguments that are one tensor, odd N -----------------------------------------------------------------------
@functools.cache
def running_pairs(dtype: str) -> CKernel2D:
    """y[t] = x[t] + x[t - dt]: run in place (y is x) it reads the step just written, a cumulative sum."""
    d = get_dtype(dtype)
    kernel = CKernel2D(f"running_pairs_{d.name}")
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"{d.ctype} *", "y")
    kernel.core = f"y[t] = t - dt < 0 ? x[t] : {cfunction.add(None, 'x[t]', 'x[t - dt]', dtype=d)};"
    return kernel


@functools.cache
def increments(dtype: str) -> CKernel1D:
    d = get_dtype(dtype)
    kernel = CKernel1D(f"increments_{d.name}")
    kernel.add_param(f"{d.ctype} *", "a")
    kernel.add_param(f"{d.ctype} *", "b")
    kernel.core = "\n".join(f"{v}[index] = {cfunction.add(None, f'{v}[index]', 1.0, dtype=d)};" for v in "ab")
    return kernel


@pytest.mark.parametrize("dtype", PACKED)
@pytest.mark.parametrize("n", [6, 7])
def test_a_tensor_given_twice_stays_one_tensor_with_an_odd_count(dtype: str, n: int):
    """simple_call pads an odd count by a copy of each tensor: given as both x and y (in place), the kernel read
    one copy and wrote another, so odd N computed what even N computes out of place."""
    tdt = get_dtype(dtype).torch_dtype
    x = torch.arange(3 * n, dtype=tdt).reshape(3, n)
    expected = x.float().cumsum(0).to(tdt)
    running_pairs(dtype).simple_call(x=x, y=x, backend="host")
    assert_same(x, expected)

    a = torch.zeros(n, dtype=tdt)  # two written parameters, one tensor: both increments land
    increments(dtype).simple_call(a=a, b=a, backend="host")
    assert_same(a, torch.full((n,), 2.0, dtype=tdt))


@pytest.mark.parametrize("dtype", PACKED)
def test_distinct_tensors_of_one_odd_shape_stay_distinct(dtype: str):
    tdt = get_dtype(dtype).torch_dtype
    x = torch.arange(15, dtype=tdt).reshape(3, 5)
    y = torch.empty_like(x)
    running_pairs(dtype).simple_call(x=x, y=y, backend="host")
    assert_same(x, torch.arange(15, dtype=tdt).reshape(3, 5))
    assert_same(y, torch.cat([x[:1], x[1:] + x[:-1]]))


@pytest.fixture(scope="module", autouse=True)
def compiled() -> int:
    """Every kernel above, compiled up front many to a compiler run (`conftest.compile_launched`)."""
    calls = [functools.partial(run_emitters, d) for d in DTYPES]
    calls += [functools.partial(test_post_core_runs_also_over_zero_steps, d, 1) for d in ("float32", "float16")]
    calls += [functools.partial(test_a_tensor_given_twice_stays_one_tensor_with_an_odd_count, d, 7) for d in PACKED]
    return compile_launched(*calls)
