"""The kernel builder: parameter parsing, signatures, names, source views, argument checks and packing,
CodeTyper/CodeBlock, the Jinja templates. No GPU needed (argument checks run on CPU and meta tensors)."""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.meta
import numpy as np
import pytest
import torch

from autocuda.base.resources import resource_dir
from autocuda.codegen.ckernel import CKernel, CKernel1D, CKernel2D, CodeBlock, CodeTyper, CParam, KernelArgumentError
from autocuda.codegen.render import environment, render


# -- CParam ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spelling", "ctype", "pointer", "const", "torch_dtype"), [
    ("float", "float", False, False, torch.float32),
    ("const float", "float", False, True, torch.float32),
    ("const float &", "float", False, True, torch.float32),
    ("float&", "float", False, False, torch.float32),
    ("const float *", "float", True, True, torch.float32),
    ("const float*", "float", True, True, torch.float32),
    ("float *", "float", True, False, torch.float32),
    ("float * __restrict__", "float", True, False, torch.float32),
    ("  const   float  *  ", "float", True, True, torch.float32),
    ("double", "double", False, False, torch.float64),
    ("const double *", "double", True, True, torch.float64),
    ("half2", "half2", False, False, torch.float16),
    ("const half2 *", "half2", True, True, torch.float16),
    ("half2*", "half2", True, False, torch.float16),
    ("__nv_bfloat162 *", "__nv_bfloat162", True, False, torch.bfloat16),
    ("const nv_bfloat162 &", "nv_bfloat162", False, True, torch.bfloat16),
    ("const __half *", "__half", True, True, torch.float16),  # single elements: pointers only
    ("__nv_bfloat16*", "__nv_bfloat16", True, False, torch.bfloat16),
    ("int", "int", False, False, torch.int32),
    ("const int &", "int", False, True, torch.int32),
    ("const int *", "int", True, True, torch.int32),
    ("unsigned   int", "unsigned int", False, False, torch.int32),
    ("const long long", "long long", False, True, torch.int64),
    ("long long *", "long long", True, False, torch.int64),
    ("int64_t", "long long", False, False, torch.int64),  # NVRTC knows no int64_t
    ("unsigned char *", "unsigned char", True, False, torch.uint8),
    ("const bool *", "bool", True, True, torch.bool),
])
def test_cparam_parse(spelling: str, ctype: str, pointer: bool, const: bool, torch_dtype: torch.dtype):
    param = CParam.parse(spelling, "p")
    assert (param.name, param.ctype, param.pointer, param.const) == ("p", ctype, pointer, const)
    assert param.torch_dtype == torch_dtype
    assert "&" not in param.declaration()  # references (the seeds' scalars) become values


@pytest.mark.parametrize("spelling", ["char", "float **", "std::string", "", "const", "float[]", "float3 *",
                                      "struct foo *", "int32_t", "float const *", "float &&", "half *",
                                      "__half", "const __nv_bfloat16 &"])
def test_cparam_refuses_unknown_types(spelling: str):
    with pytest.raises(ValueError, match="unsupported C type") as info:
        CParam.parse(spelling, "p")
    assert "float" in str(info.value) and "half2" in str(info.value)  # the message lists what is supported


@pytest.mark.parametrize(("spelling", "text"), [
    ("const float &", "const float alpha"), ("float", "float alpha"), ("const half2 *", "const half2* alpha"),
    ("float *", "float* alpha"), ("const long long", "const long long alpha"),
])
def test_cparam_declaration(spelling: str, text: str):
    assert CParam.parse(spelling, "alpha").declaration() == text


def test_restrict_is_opt_in():
    param = CParam.parse("const float *", "x")
    assert param.declaration(restrict=True) == "const float* __restrict__ x"
    assert "__restrict__" not in param.declaration()


# -- names ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["heaviside", "lif_fwd", "k2", "CumSum"])
def test_good_kernel_names(name: str):
    assert CKernel(name).kernel_name == name


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x" * 64, "__foo", "a__b", "ac_kernel", "int", "for",
                                  "class", "threadIdx", "blockDim", "expf", "_private", "naïve", 3, None])
@pytest.mark.parametrize("cls", [CKernel, CKernel1D, CKernel2D])
def test_bad_kernel_names_are_refused(cls: type, name):
    with pytest.raises(ValueError, match="kernel name"):
        cls(name)


@pytest.mark.parametrize(("cls", "name"), [
    (CKernel1D, "index"), (CKernel1D, "numel"), (CKernel2D, "N"), (CKernel2D, "t"), (CKernel2D, "dt"),
    (CKernel2D, "numel"), (CKernel2D, "index"), (CKernel1D, "backend"), (CKernel2D, "backend"),
    (CKernel, "threadIdx"), (CKernel, "float"), (CKernel, "ac_tmp"), (CKernel, "x-y"), (CKernel, "xor"),
])
def test_reserved_parameter_names_are_refused(cls: type, name: str):
    kernel = cls("k")
    before = dict(kernel.cparams)
    with pytest.raises(ValueError, match=f"parameter name '{re.escape(name)}'"):
        kernel.add_param("const float *", name)
    assert kernel.cparams == before


def test_duplicate_parameter_is_refused():
    kernel = CKernel1D("k")
    kernel.add_param("const float *", "x")
    with pytest.raises(ValueError, match="already a parameter"):
        kernel.add_param("float *", "x")


def test_bad_type_leaves_the_parameter_list_alone():
    kernel = CKernel1D("k")
    with pytest.raises(ValueError):
        kernel.add_param("char *", "x")
    assert list(kernel.cparams) == ["numel"]


# -- source -----------------------------------------------------------------------------------------------
def make(cls: type, ctype: str = "float", **kwargs) -> CKernel:
    kernel = cls("demo", **kwargs)
    kernel.add_param(f"const {ctype} *", "x")
    kernel.add_param(f"{ctype} *", "y")
    kernel.add_param("const float &", "alpha")
    kernel.core = "\n        y[ac_i] = x[ac_i];  // USER CORE\n    "
    return kernel


BUILTIN = {CKernel: [], CKernel1D: ["numel"], CKernel2D: ["numel", "N"]}


@pytest.mark.parametrize("cls", [CKernel, CKernel1D, CKernel2D])
def test_full_codes_declare_params_in_order_and_hold_the_core(cls: type):
    codes = make(cls).full_codes
    signature = re.search(r'extern "C" __global__ void demo\((.*?)\)\s*\{', codes, re.S)
    assert signature, codes
    declared = [re.split(r"[\s*]+", p.strip())[-1] for p in signature.group(1).split(",") if p.strip()]
    assert declared == [*BUILTIN[cls], "x", "y", "alpha"]
    assert "const float* x" in codes and "float* y" in codes and "const float alpha" in codes
    assert "y[ac_i] = x[ac_i];  // USER CORE" in codes
    assert codes.count("{") == codes.count("}")


def test_core_is_dedented_and_indented_to_its_block():
    kernel = CKernel1D("k")
    kernel.core = """
        float a = 1.0f;
        if (a > 0.0f) {
            a = 2.0f;
        }
    """
    lines = kernel.full_codes.splitlines()
    start = next(i for i, line in enumerate(lines) if "float a" in line)
    body = lines[start:start + 4]
    indents = [len(line) - len(line.lstrip()) for line in body]
    assert indents[1] == indents[0] and indents[2] == indents[0] + 4 and indents[3] == indents[0]
    assert indents[0] > len(lines[start - 1]) - len(lines[start - 1].lstrip())  # inside the `if (index...)`


def test_2d_pre_and_post_core_surround_the_time_loop():
    kernel = make(CKernel2D)
    kernel.pre_core = "float acc = 0.0f;  // PRE"
    kernel.post_core = "y[index] = acc;  // POST"
    codes = kernel.full_codes
    pre, loop, core, post = (codes.index(s) for s in ("// PRE", "for (", "// USER CORE", "// POST"))
    assert pre < loop < core < post


def _loop_header(codes: str) -> str:
    match = re.search(r"for \((.*)\)", codes)
    assert match, codes
    return match.group(1)


def test_reverse_changes_only_the_loop():
    forward, backward = make(CKernel2D).full_codes, make(CKernel2D, reverse=True).full_codes
    assert forward != backward
    assert re.fullmatch(r"long long t = index; t < numel; t \+= dt", _loop_header(forward))
    assert re.fullmatch(r"long long t = numel - N \+ index; t >= 0; t -= dt", _loop_header(backward))
    assert forward.replace(_loop_header(forward), "") == backward.replace(_loop_header(backward), "")


@pytest.mark.parametrize("cls", [CKernel, CKernel1D, CKernel2D])
def test_views_are_consecutive_parts_of_full_codes(cls: type):
    kernel = make(cls, ctype="half2")
    codes = kernel.full_codes
    parts = [kernel.declaration, kernel.head, "y[ac_i] = x[ac_i];  // USER CORE", kernel.tail]
    end = 0
    for part in parts:  # each part found after the one before
        start = codes.find(part, end)
        assert start >= end, (part, codes)
        assert codes[end:start].strip() == "", codes[end:start]  # nothing between the parts
        end = start + len(part)
    assert codes.startswith(kernel.declaration) and codes.rstrip().endswith(kernel.tail)
    assert "__global__" in kernel.declaration and "__global__" not in kernel.head + kernel.tail


def test_full_codes_follow_changes():
    kernel = make(CKernel1D)
    first = kernel.full_codes
    kernel.core = "y[index] = 2.0f * x[index];"
    assert kernel.full_codes != first and "2.0f * x[index]" in kernel.full_codes
    kernel.add_param("const float *", "z")
    assert "const float* z" in kernel.full_codes


@pytest.mark.parametrize(("ctypes", "headers"), [
    (["float", "double"], []),
    (["float", "int", "long long"], []),
    (["half2"], ["cuda_fp16.h"]),
    (["__nv_bfloat162", "float"], ["cuda_bf16.h"]),
    (["nv_bfloat162"], ["cuda_bf16.h"]),
    (["half2", "__nv_bfloat162"], ["cuda_fp16.h", "cuda_bf16.h"]),
])
@pytest.mark.parametrize("cls", [CKernel1D, CKernel2D])
def test_headers_only_with_packed_params(cls: type, ctypes: list[str], headers: list[str]):
    kernel = cls("k")
    for i, ctype in enumerate(ctypes):
        kernel.add_param(f"const {ctype} *", f"p{i}")
    included = re.findall(r"#include <([^>]+)>", kernel.full_codes)
    assert sorted(included) == sorted(headers)
    assert ("ac_h2_select" in kernel.full_codes) == ("cuda_fp16.h" in headers)  # lane helpers come along


def test_packed_scalar_param_also_brings_its_header():
    kernel = CKernel1D("k")
    kernel.add_param("const half2", "alpha")
    assert "#include <cuda_fp16.h>" in kernel.full_codes


def test_reverse_and_kernel_name_are_checked_when_set():
    """reverse="False" is truthy (it reversed the loop); a name set after construction was not checked."""
    with pytest.raises(TypeError, match="reverse: expected True or False, got 'False'"):
        CKernel2D("k", reverse="False")  # type: ignore[arg-type]
    kernel = make(CKernel2D)
    with pytest.raises(TypeError, match="reverse: expected True or False, got 1"):
        kernel.reverse = 1
    with pytest.raises(ValueError, match=r"kernel name 'a b'"):
        kernel.kernel_name = "a b"
    assert kernel.reverse is False and kernel.kernel_name == "demo"


def test_check_attributes():
    kernel = make(CKernel2D, reverse=True)
    assert kernel.check_attributes(reverse=True, kernel_name="demo")
    assert not kernel.check_attributes(reverse=False)


# -- argument checks (no GPU: checks run before anything is launched) -----------------------------------------
@pytest.fixture
def kernel() -> CKernel1D:
    return make(CKernel1D)


def args(**changes):
    base = {"numel": 8, "x": torch.zeros(8), "y": torch.zeros(8), "alpha": 0.5}
    return {k: v for k, v in (base | changes).items() if v is not _DROP}


_DROP = object()


def test_valid_arguments_pass(kernel: CKernel1D):
    assert kernel.check_args(args(), backend="host") == torch.device("cpu")


@pytest.mark.parametrize(("changes", "pattern"), [
    ({"alpha": _DROP}, r"missing arguments \['alpha'\]"),
    ({"x": _DROP, "y": _DROP}, r"missing arguments \['x', 'y'\]"),
    ({"beta": 1.0}, r"unexpected arguments \['beta'\]"),
    ({"x": torch.zeros(8, dtype=torch.float64)}, r"x: expected dtype torch.float32 .*got torch.float64"),
    ({"y": torch.zeros(8, dtype=torch.float16)}, r"y: expected dtype torch.float32 .*got torch.float16"),
    ({"x": torch.zeros(4, 4).t()}, r"x: tensor must be contiguous"),
    ({"y": torch.zeros(16)[::2]}, r"y: tensor must be contiguous"),
    ({"alpha": torch.tensor(0.5)}, r"alpha: a scalar of C type float is passed by value"),
    ({"alpha": np.array([0.5])}, r"alpha: a scalar of C type float is passed by value"),
    ({"alpha": "0.5"}, r"alpha: expected a real number for float, got str"),
    ({"x": np.zeros(8, dtype=np.float32)}, r"x: expected a torch.Tensor .*__dlpack__.*got ndarray"),
    ({"y": torch.zeros(8, device="meta")}, r"y: on meta, expected cpu"),
    # the lazy negation bit: the kernel read +2 where torch reads -2, and wrote where torch reads the negation
    ({"x": torch.tensor([1 + 2j]).conj().imag}, r"x: a tensor with torch's lazy negation bit .*resolve_neg"),
    ({"y": torch.tensor([1 + 2j]).conj().imag}, r"y: a tensor with torch's lazy negation bit"),
    # a complex scalar lost its imaginary part; an int beyond a double was a bare OverflowError
    ({"alpha": np.complex128(3 + 4j)}, r"alpha: expected a real number for float, got complex128"),
    ({"alpha": 10**400}, r"alpha: an integer of 1329 bits is beyond a double's range \(float\)"),
])
def test_bad_arguments_are_explained(kernel: CKernel1D, changes: dict, pattern: str):
    with pytest.raises(KernelArgumentError, match=pattern):
        kernel.check_args(args(**changes), backend="host")


@pytest.mark.parametrize(("make_x", "kind"), [
    (lambda: torch.ones(8).to_sparse(), "torch.sparse_coo"),
    (lambda: torch.ones(2, 4).to_sparse_csr(), "torch.sparse_csr"),
    (lambda: torch.nested.nested_tensor([torch.ones(3), torch.ones(5)]), "nested"),
])
def test_a_sparse_or_nested_tensor_is_refused_as_not_dense(kernel: CKernel1D, make_x: Callable, kind: str):
    """COO was told to call .contiguous() (which does not help), CSR and nested gave torch's internal errors."""
    with warnings.catch_warnings():  # torch's notes that these layouts are in beta or a prototype
        warnings.simplefilter("ignore")
        x = make_x()
    with pytest.raises(KernelArgumentError, match=f"^x: expected a dense tensor, got a {kind} one .*to_dense"):
        kernel.simple_call(x=x, y=torch.zeros(8), alpha=1.0)


@pytest.mark.parametrize("ctype", ["double", "half2", "__nv_bfloat162"])
def test_a_floating_scalar_is_a_real_number_a_double_holds(ctype: str):
    kernel = CKernel1D("reals")
    kernel.add_param("float *", "y")
    kernel.add_param(f"const {ctype}", "a")
    with pytest.raises(KernelArgumentError, match=f"a: expected a real number for {ctype}, got complex64"):
        kernel.check_args({"numel": 1, "y": torch.zeros(1), "a": np.complex64(1 + 1j)})
    with pytest.raises(KernelArgumentError, match="a: an integer of 1329 bits is beyond a double's range"):
        kernel.check_args({"numel": 1, "y": torch.zeros(1), "a": -10**400})
    kernel.check_args({"numel": 1, "y": torch.zeros(1), "a": np.float32(1.5)})


class _NoMemory(torch.Tensor):
    """A tensor subclass without storage, as a FakeTensor is (whose mode takes seconds to make)."""

    @staticmethod
    def __new__(cls, n: int) -> _NoMemory:
        return torch.Tensor._make_wrapper_subclass(cls, (n,), dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_a_tensor_without_memory_is_refused_before_its_address_is_used(kernel: CKernel1D):
    """A FakeTensor used outside its mode and a functional tensor say 'cpu' and have address 0: the host runner
    dereferenced it (a segfault)."""
    for name, value in (("x", _NoMemory(8)), ("y", torch._to_functional_tensor(torch.zeros(8)))):
        with pytest.raises(KernelArgumentError, match=f"^{name}: a tensor with no memory behind it"):
            kernel.check_args(args(**{name: value}), backend="host")
        with pytest.raises(KernelArgumentError, match=f"^{name}: a tensor with no memory behind it"):
            kernel.pack_args(args(**{name: value}))
    kernel.check_args(args(x=torch.zeros(0), y=torch.zeros(0)))  # an empty tensor has address 0 and nothing to read


def _counts() -> CKernel1D:
    k = CKernel1D("counts")
    k.add_param("float *", "y")
    k.add_param("const int", "n")
    k.add_param("const unsigned char", "u")
    k.core = "y[index] = (float)n + (float)u;"
    return k


@pytest.mark.parametrize(("n", "u", "pattern"), [
    (2.5, 1, r"n: expected an integer for int, got float 2.5"),  # was truncated to 2
    (np.float64(3.0), 1, r"n: expected an integer for int, got float64"),
    (float("nan"), 1, r"n: expected an integer"),
    (2**31, 1, r"n: 2147483648 is out of range for int \(-2147483648 to 2147483647\)"),  # was NumPy's OverflowError
    (1, -1, r"u: -1 is out of range for unsigned char \(0 to 255\)"),
    (1, torch.tensor(2), r"u: a scalar of C type unsigned char is passed by value"),
])
def test_an_integer_scalar_is_an_integer_the_c_type_holds(n: Any, u: Any, pattern: str):
    with pytest.raises(KernelArgumentError, match=pattern):
        _counts().simple_call(y=torch.zeros(3), n=n, u=u)


def test_integer_scalars_of_python_numpy_and_bool_run():
    y = torch.zeros(3)
    _counts().simple_call(y=y, n=np.int64(-4), u=True)
    assert y.tolist() == [-3.0] * 3


def test_a_written_tensor_counts_the_write_for_autograd_and_one_that_requires_grad_is_refused():
    """The kernel writes through the address: the version counter is bumped, as by any in-place op, so a graph that
    saved the tensor fails at backward instead of using the new values silently; a written tensor that requires grad
    is refused under grad mode (torch's rule for `out=`), and written under no_grad (as an optimiser step)."""
    w = torch.ones(3, requires_grad=True)
    y = w * 2
    loss = (y * y).sum()  # saves y
    _counts().simple_call(y=y.detach(), n=1, u=1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(KernelArgumentError, match="y: the kernel writes it, but it requires grad"):
        _counts().simple_call(y=w, n=1, u=1)
    with torch.no_grad():
        _counts().simple_call(y=w, n=1, u=1)
    assert w.tolist() == [2.0] * 3 and w.requires_grad


def test_a_tensor_given_for_a_scalar_is_named_by_its_check_not_by_the_shapes(kernel: CKernel1D):
    with pytest.raises(KernelArgumentError, match="alpha: a scalar of C type float is passed by value"):
        kernel.simple_call(x=torch.zeros(3), y=torch.zeros(3), alpha=torch.tensor(0.5))


def test_cpu_tensors_are_refused_on_the_cuda_backend(kernel: CKernel1D):
    with pytest.raises(KernelArgumentError, match=r"x: on cpu.*backend 'cuda'.*cuda tensors.*backend='host'"):
        kernel.check_args(args(), backend="cuda")


def test_without_a_backend_the_tensors_device_picks_it(kernel: CKernel1D):
    assert kernel.check_args(args()) == torch.device("cpu")  # the host runner's
    meta = args(x=torch.zeros(8, device="meta"), y=torch.zeros(8, device="meta"))
    with pytest.raises(KernelArgumentError, match=r"x: on meta; .*cuda tensors \(backend 'cuda'\) or cpu"):
        kernel.check_args(meta)


def test_no_tensor_at_all_is_refused():
    kernel = CKernel1D("k")
    kernel.add_param("const float", "alpha")
    with pytest.raises(KernelArgumentError, match="no tensor"):
        kernel.check_args({"numel": 1, "alpha": 1.0})


def test_unknown_backend_is_refused(kernel: CKernel1D):
    with pytest.raises(ValueError, match="unknown backend"):
        kernel((1,), (32,), args(), backend="opencl")


def test_simple_call_reports_unknown_keys_as_argument_errors(kernel: CKernel1D):
    with pytest.raises(KernelArgumentError, match=r"unexpected arguments \['z'\]"):
        kernel.simple_call(x=torch.zeros(3), y=torch.zeros(3), alpha=1.0, z=torch.zeros(3))


@pytest.mark.parametrize(("cls", "kwargs", "pattern"), [
    (CKernel1D, {"x": torch.zeros(0), "y": torch.zeros(0, dtype=torch.int64), "alpha": 1.0},
     r"y: expected dtype torch.float32"),
    (CKernel1D, {"x": torch.zeros(0)}, r"missing arguments \['y', 'alpha'\]"),
    (CKernel1D, {"x": torch.zeros(0), "yy": torch.zeros(0), "alpha": 1.0}, r"unexpected arguments \['yy'\]"),
    (CKernel1D, {"x": torch.zeros(0), "y": torch.zeros(0), "alpha": "1"}, r"alpha: expected a real number"),
    (CKernel1D, {"x": torch.zeros(0), "y": torch.zeros(0), "alpha": 1.0, "backend": "opencl"}, "unknown backend"),
    (CKernel2D, {"x": torch.zeros(0, 4), "y": torch.zeros(0, 4, dtype=torch.float64), "alpha": 1.0},
     r"y: expected dtype torch.float32"),
    (CKernel2D, {"x": torch.zeros(5, 0), "alpha": 1.0}, r"missing arguments \['y'\]"),
])
def test_an_empty_call_checks_its_arguments_before_launching_nothing(cls: type, kwargs: dict, pattern: str):
    """simple_call returned before any check where there was nothing to launch (numel 0, T * N 0)."""
    with pytest.raises((KernelArgumentError, ValueError), match=pattern):
        make(cls).simple_call(**kwargs)
    make(cls).simple_call(x=torch.zeros(0, 4), y=torch.zeros(0, 4), alpha=1.0)  # valid: nothing runs


@pytest.mark.parametrize("cls", [CKernel1D, CKernel2D])
@pytest.mark.parametrize(("x", "y"), [("const float *", "half2 *"), ("const half2 *", "float *"),
                                      ("const __nv_bfloat162 *", "__nv_bfloat16 *")])
def test_simple_call_refuses_packed_and_single_value_pointers_together(cls: type, x: str, y: str):
    """numel (N) counts one kind of word: a float x and a half2 y of one shape had the kernel write past y (numel
    the float count), or read past x the other way; in 2-D, dt in half2 words addressed a float [T, N] wrongly."""
    kernel = cls("mixed")
    kernel.add_param(x, "x")
    kernel.add_param(y, "y")
    kernel.core = ""
    dtypes = [CParam.parse(ctype, "p").torch_dtype for ctype in (x, y)]
    for shape in ((0, 8), (3, 8)):  # an empty call is checked too; none is launched
        with pytest.raises(KernelArgumentError, match=r"simple_call counts one kind of word, but \['[xy]'\] point "
                                                      r"to packed words .* to single values"):
            kernel.simple_call(x=torch.zeros(shape, dtype=dtypes[0]), y=torch.zeros(shape, dtype=dtypes[1]))


def test_cuda_launch_follows_changes_to_the_kernel(monkeypatch: pytest.MonkeyPatch):
    """The launcher was kept per device, compiled from the first source: a changed core, reverse or parameter list
    launched the old kernel."""
    import autocuda.toolchain.launch as launch

    compiled: list[tuple[str, str, tuple]] = []
    monkeypatch.setattr(launch, "packed_launch", lambda *made: compiled.append(made[:3]) or len(compiled))
    kernel = make(CKernel2D)
    assert kernel.cuda_launch(0) == 1 and kernel.cuda_launch(0) == 1  # kept while the kernel is unchanged
    kernel.core = "y[t] = 2.0f * x[t];"
    assert kernel.cuda_launch(0) == 2 and "2.0f * x[t]" in compiled[-1][0]
    kernel.reverse = True
    assert kernel.cuda_launch(0) == 3 and compiled[-1][0] == kernel.full_codes
    kernel.add_param("const float *", "z")
    assert kernel.cuda_launch(0) == 4 and [p.name for p in compiled[-1][2]][-1] == "z"
    assert kernel.cuda_launch(1) == 5 and kernel.cuda_launch(0) == 4  # one per device


def test_simple_call_1d_needs_one_shape(kernel: CKernel1D):
    """Element i of x is element i of y: the same element count in another shape is refused."""
    with pytest.raises(KernelArgumentError, match=r"one shape, got \{'x': \(2, 3\), 'y': \(3, 2\)\}"):
        kernel.simple_call(x=torch.zeros(2, 3), y=torch.zeros(3, 2), alpha=1.0)
    with pytest.raises(KernelArgumentError, match="one shape"):
        kernel.simple_call(x=torch.zeros(6), y=torch.zeros(2, 3), alpha=1.0)


def test_simple_call_2d_needs_one_shape():
    kernel = make(CKernel2D)
    with pytest.raises(KernelArgumentError, match=r"\[T, N\]"):
        kernel.simple_call(x=torch.zeros(4, 3), y=torch.zeros(4, 5), alpha=1.0)
    with pytest.raises(KernelArgumentError, match="1-D tensors must have N=3"):
        kernel.simple_call(x=torch.zeros(4, 3), y=torch.zeros(2), alpha=1.0)


def test_pack_args_order_and_widths():
    kernel = CKernel2D("k")
    for ctype, name in [("const float *", "x"), ("float *", "y"), ("const float &", "alpha"), ("double", "beta"),
                        ("const int", "k"), ("long long", "n"), ("unsigned int", "u"), ("const half2", "h"),
                        ("const __nv_bfloat162", "b"), ("bool", "flag")]:
        kernel.add_param(ctype, name)
    x, y = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 3)
    values = {"numel": 6, "N": 3, "x": x, "y": y, "alpha": 0.1, "beta": 0.1, "k": -3, "n": 2**40, "u": 7,
              "h": 1.5, "b": -2.0, "flag": True}
    packed = kernel.pack_args(values)
    expected = [(np.int64, 6), (np.int64, 3), (np.uint64, x.data_ptr()), (np.uint64, y.data_ptr()),
                (np.float32, np.float32(0.1)), (np.float64, 0.1), (np.int32, -3), (np.int64, 2**40),
                (np.uint32, 7), (np.uint32, 0x3E003E00), (np.uint32, 0xC000C000), (np.bool_, True)]
    assert [type(v) for v in packed] == [t for t, _ in expected]
    assert [v.item() for v in packed] == [v for _, v in expected]


# -- CodeTyper / CodeBlock ----------------------------------------------------------------------------------
def test_code_typer_indents_each_statement():
    typer = CodeTyper(4)
    typer.append("z = (x * mask);\nconst float s = 1.0f;")
    typer.append("\n   y = s;  \n\n")
    assert typer.codes == "    z = (x * mask);\n    const float s = 1.0f;\n    y = s;\n"
    assert CodeTyper(0).codes == ""


def test_code_block_nests_braces():
    typer = CodeTyper(2)
    typer.append("// swap")
    with CodeBlock(typer):
        typer.append("float tmp = x;")
        with CodeBlock(typer):
            typer.append("x = y;")
        typer.append("y = tmp;")
    typer.append("done();")
    assert typer.codes == ("  // swap\n  {\n      float tmp = x;\n      {\n          x = y;\n      }\n"
                           "      y = tmp;\n  }\n  done();\n")
    assert typer.indent == 2


def test_code_block_restores_indent_after_an_error():
    typer = CodeTyper(0)
    with pytest.raises(RuntimeError), CodeBlock(typer):
        typer.append("a;")
        raise RuntimeError
    assert typer.indent == 0 and typer.codes.splitlines()[-1] == "}"


def test_code_typer_output_as_a_core():
    typer = CodeTyper(0)
    with CodeBlock(typer):
        typer.append("y[index] = x[index];")
    kernel = make(CKernel1D)
    kernel.core = typer.codes
    assert "        {\n            y[index] = x[index];\n        }" in kernel.full_codes


# -- templates ------------------------------------------------------------------------------------------------
TEMPLATES = sorted(p.name for p in resource_dir("templates").glob("*.j2"))
KERNEL_TEMPLATES = {cls.template: cls for cls in (CKernel, CKernel1D, CKernel2D)}


def _variables(name: str) -> set[str]:
    """Every variable a template (and the templates it extends) reads."""
    env = environment()
    ast = env.parse(env.loader.get_source(env, name)[0])
    found = set(jinja2.meta.find_undeclared_variables(ast))
    for parent in jinja2.meta.find_referenced_templates(ast):
        found |= _variables(parent)
    return found


def test_environment_is_strict():
    assert environment().undefined is jinja2.StrictUndefined
    assert set(KERNEL_TEMPLATES) <= set(TEMPLATES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_refuses_an_empty_context(name: str):
    if not _variables(name):
        pytest.skip(f"{name} reads no variables")
    with pytest.raises(jinja2.UndefinedError):
        render(name)


@pytest.mark.parametrize("name", sorted(KERNEL_TEMPLATES))
def test_kernel_template_raises_for_each_missing_variable(name: str):
    kernel = make(KERNEL_TEMPLATES[name], ctype="half2")
    if isinstance(kernel, CKernel2D):
        kernel.pre_core, kernel.post_core = "float acc = 0.0f;", "y[index] = acc;"
    context = kernel._context()
    used = _variables(name)
    assert used <= set(context), used - set(context)
    assert render(name, **context) == kernel.full_codes
    for key in used:
        with pytest.raises(jinja2.UndefinedError):
            render(name, **{k: v for k, v in context.items() if k != key})
