"""The kernel builder: parameter records and the CKernel family.

A kernel's parameters are declared once (`add_param`). The C signature, the checks on what a caller
passes, and the packing of launch arguments (pointers as 64-bit addresses, scalars by value in the
declared width) all derive from that one list.
"""
from __future__ import annotations

import math
import re
import textwrap
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..base.errors import KernelArgumentError
from ..base.switches import check_switches
from ..toolchain import arrays
from ..toolchain.cnames import identifier_problem
from ..toolchain.host.runner import launch_dims
from .dtypes import DTYPES, INTEGER_CTYPES, DType, get_dtype, headers_for
from .render import render, render_block

_CTYPE = re.compile(r"^\s*(const\s+)?([A-Za-z_][A-Za-z0-9_ ]*?)\s*([*&]?)\s*(__restrict__)?\s*$")
_FLOAT_CTYPES = {d.ctype: d for d in DTYPES.values()} | {"nv_bfloat162": DTYPES["bfloat16"]}
_SPELLINGS = {"int64_t": "long long"}  # NVRTC has no <cstdint>: declare with the built-in type
# Single half / bfloat16 elements: pointers only (generated kernels address neurons one by one).
_ELEMENT_CTYPES = {d.element: d for d in DTYPES.values() if d.packed}
INDEX_CTYPE = "long long"  # 64-bit: T*N past 2**31 elements must not overflow


@dataclass(frozen=True)
class CParam:
    """One kernel parameter: a pointer to tensor data or a scalar passed by value.

    `name` is the key a caller passes its value under; `cname` its spelling in the source, where that differs
    (generated kernels spell what holds a user's name through `cnames.c_name`). Only the signature reads the
    spelling: checking and packing go by key, position and type, so the spelling is no part of a parameter's
    identity."""

    name: str
    ctype: str
    pointer: bool
    const: bool
    cname: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.cname:
            object.__setattr__(self, "cname", self.name)

    @classmethod
    def parse(cls, ctype: str, name: str) -> CParam:
        match = _CTYPE.match(ctype)
        base = " ".join(match.group(2).split()) if match else ""
        pointer = match is not None and match.group(3) == "*"
        allowed = set(_FLOAT_CTYPES) | set(INTEGER_CTYPES) | (set(_ELEMENT_CTYPES) if pointer else set())
        if not match or base not in allowed:
            known = ", ".join(sorted(allowed))
            raise ValueError(f"parameter {name!r}: unsupported C type {ctype!r}; base types: {known}")
        # `const float &` (the seeds' spelling of a scalar) is taken as a scalar passed by value.
        return cls(name, _SPELLINGS.get(base, base), match.group(3) == "*", bool(match.group(1)))

    @property
    def dtype(self) -> DType | None:
        return _FLOAT_CTYPES.get(self.ctype) or _ELEMENT_CTYPES.get(self.ctype)

    @property
    def packed(self) -> bool:
        """Points to packed words (half2, bfloat162): element counts must be padded to whole words."""
        return self.pointer and self.ctype in _FLOAT_CTYPES and _FLOAT_CTYPES[self.ctype].packed

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.dtype.torch_dtype if self.dtype else INTEGER_CTYPES[self.ctype][0]

    def declaration(self, restrict: bool = False, cname: str = "") -> str:
        """C text declaring the parameter (as `cname`, by default its own spelling); `restrict` only where the
        caller guarantees no two pointers alias (generated kernels)."""
        const, cname = "const " if self.const else "", cname or self.cname
        if not self.pointer:
            return f"{const}{self.ctype} {cname}"
        return f"{const}{self.ctype}* {'__restrict__ ' if restrict else ''}{cname}"

    def check(self, value: Any, device: torch.device | None) -> None:
        if self.pointer:
            self._check_tensor(value, device)
        elif isinstance(value, (torch.Tensor, np.ndarray)) or arrays.is_array(value):
            raise KernelArgumentError(f"{self.name}: a scalar of C type {self.ctype} is passed by value; got an array")
        elif self.dtype is None:
            self._check_integer(value)
        else:
            self._check_real(value)

    def _check_real(self, value: Any) -> None:
        """A floating scalar: a real number (a complex one would lose its imaginary part) that a double holds;
        beyond the C type's range it is passed as an infinity, as torch's conversion gives."""
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise KernelArgumentError(f"{self.name}: expected a real number for {self.ctype}, got "
                                      f"{type(value).__name__}")
        try:
            float(value)
        except OverflowError:
            raise KernelArgumentError(f"{self.name}: an integer of {int(value).bit_length()} bits is beyond a "
                                      f"double's range ({self.ctype})") from None

    def _check_integer(self, value: Any) -> None:
        """An integer scalar: an int (or bool) the C type holds; a float is refused, not truncated."""
        if not isinstance(value, (int, np.integer, np.bool_)):
            raise KernelArgumentError(f"{self.name}: expected an integer for {self.ctype}, got "
                                      f"{type(value).__name__} {value!r}")
        kind = INTEGER_CTYPES[self.ctype][1]
        low, high = (0, 1) if kind is np.bool_ else (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
        if not low <= int(value) <= high:
            raise KernelArgumentError(f"{self.name}: {value} is out of range for {self.ctype} ({low} to {high})")

    def _check_tensor(self, value: Any, device: torch.device | None) -> None:
        if not isinstance(value, torch.Tensor):
            raise KernelArgumentError(f"{self.name}: expected a torch.Tensor (or, passed to the kernel, an array with "
                                      f"__dlpack__ or __cuda_array_interface__), got {type(value).__name__}")
        problem = arrays.dense_problem(self.name, value)  # a kernel addresses one dense block of memory
        if problem is not None:
            raise KernelArgumentError(problem)
        if value.dtype != self.torch_dtype:
            raise KernelArgumentError(f"{self.name}: expected dtype {self.torch_dtype} (C type {self.ctype}), "
                                      f"got {value.dtype}")
        if device is not None and value.device != device:
            raise KernelArgumentError(f"{self.name}: on {value.device}, expected {device} like the other tensors")
        if not value.is_contiguous():
            raise KernelArgumentError(f"{self.name}: tensor must be contiguous (call .contiguous() first)")
        if value.is_neg():  # torch negates on reading; a kernel reads the memory as it is
            raise KernelArgumentError(f"{self.name}: a tensor with torch's lazy negation bit (the kernel would read "
                                      f"its values unnegated); pass .resolve_neg()")
        self._address(value)
        if not self.const and value.requires_grad and torch.is_grad_enabled():  # torch's rule for out= and in place
            raise KernelArgumentError(f"{self.name}: the kernel writes it, but it requires grad: autograd cannot "
                                      f"differentiate a kernel's writes (write under torch.no_grad(), or into a "
                                      f"tensor that does not require grad)")

    def _address(self, tensor: torch.Tensor) -> int:
        """The tensor's data address. A tensor with elements at address 0, or none (a FakeTensor, a functional tensor:
        the stand-ins torch.compile, torch.export and make_fx trace with), has no memory a launch could read."""
        try:
            if type(tensor) is torch.Tensor:
                address = tensor.data_ptr()
            else:
                with warnings.catch_warnings():  # torch warns that a FakeTensor's address is deprecated, then gives 0
                    warnings.simplefilter("ignore")
                    address = tensor.data_ptr()
        except RuntimeError:  # torch's refusal of a stand-in's address
            address = 0
        if address == 0 and tensor.numel():
            raise KernelArgumentError(f"{self.name}: a tensor with no memory behind it (a FakeTensor or a functional "
                                      f"tensor, as torch.export and make_fx trace with); a launch needs a real tensor: "
                                      f"launch outside the trace, or inside a custom op")
        return address

    def pack(self, value: Any) -> np.generic:
        if self.pointer:
            return np.uint64(self._address(value))
        if self.dtype is not None:
            return self.dtype.pack_scalar(float(value))
        return INTEGER_CTYPES[self.ctype][1](value)


class CodeTyper:
    """Collects C statements with consistent indentation (`codes` is the text)."""

    def __init__(self, indent_num: int = 0):
        self.indent = indent_num
        self.lines: list[str] = []

    def append(self, codes: str) -> None:
        for line in codes.strip("\n").splitlines():
            self.lines.append(" " * self.indent + line.strip() if line.strip() else "")

    @property
    def codes(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


class CodeBlock:
    """`with CodeBlock(typer):` wraps what is appended inside in braces, one level deeper."""

    def __init__(self, env: CodeTyper):
        self.env = env

    def __enter__(self) -> CodeTyper:
        self.env.append("{")
        self.env.indent += 4
        return self.env

    def __exit__(self, *exc: object) -> None:
        self.env.indent -= 4
        self.env.append("}")


class CKernel:
    """A CUDA kernel as declaration + head + core + tail; `full_codes` is the whole source."""

    template = "kernel.cu.j2"
    builtin_params: tuple[tuple[str, str], ...] = ()
    reserved_cnames: tuple[str, ...] = ()
    launch_bounds = ""  # the arguments of the kernel's __launch_bounds__, if it has one

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.cparams: dict[str, CParam] = {}
        self.core = ""
        for ctype, name in self.builtin_params:
            self.cparams[name] = CParam.parse(ctype, name)

    def add_param(self, ctype: str, cname: str) -> None:
        problem = identifier_problem(cname)
        if problem is None and cname in self.reserved_cnames:
            problem = "is reserved by this kernel"
        if problem is None and cname in self.cparams:
            problem = "is already a parameter"
        if problem:
            raise ValueError(f"parameter name {cname!r} {problem}")
        self.cparams[cname] = CParam.parse(ctype, cname)
        self._source: str | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Any change to what the source is made of (core, reverse, ...) forgets the rendered text; a name and a
        # switch are checked as at construction.
        if name == "kernel_name" and (problem := identifier_problem(value)):
            raise ValueError(f"kernel name {value!r} {problem}")
        if name == "reverse":
            check_switches(reverse=value)
        object.__setattr__(self, name, value)
        if not name.startswith("_"):
            object.__setattr__(self, "_source", None)

    # -- source ---------------------------------------------------------------------------------------
    def _context(self) -> dict[str, Any]:
        dtypes = [p.dtype for p in self.cparams.values() if p.dtype is not None]
        preludes = dict.fromkeys(get_dtype(d).prelude for d in dtypes if get_dtype(d).prelude)
        return {"name": self.kernel_name, "headers": headers_for(dtypes), "prelude": "".join(preludes),
                "params": [p.declaration() for p in self.cparams.values()], "core": _tidy(self.core),
                "index_t": INDEX_CTYPE, "launch_bounds": self.launch_bounds}

    def _block(self, block: str) -> str:
        return render_block(self.template, block, **self._context())

    declaration = property(lambda self: self._block("declaration"))
    head = property(lambda self: self._block("head"))
    tail = property(lambda self: self._block("tail"))

    @property
    def full_codes(self) -> str:
        """The whole source, rendered once and kept until the kernel is changed."""
        source = self.__dict__.get("_source")
        if source is None:
            source = self._source = render(self.template, **self._context())
        return source

    def check_attributes(self, **kwargs: Any) -> bool:
        return all(getattr(self, k) == v for k, v in kwargs.items())

    # -- launching ------------------------------------------------------------------------------------
    def check_keys(self, py_dict: Mapping[str, Any]) -> None:
        missing = [k for k in self.cparams if k not in py_dict]
        extra = [k for k in py_dict if k not in self.cparams]
        if missing or extra:
            raise KernelArgumentError(f"kernel {self.kernel_name}: missing arguments {missing}, "
                                      f"unexpected arguments {extra}; parameters are {list(self.cparams)}")

    def get_device(self, py_dict: Mapping[str, Any], backend: str | None = None) -> torch.device:
        """The device of the first tensor argument, which `backend` (None: the device's own) must run."""
        if backend is not None and backend not in BACKEND_DEVICE_TYPES:
            raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKEND_DEVICE_TYPES)}")
        for name, param in self.cparams.items():
            value = py_dict[name]
            if param.pointer and isinstance(value, torch.Tensor):
                runs = DEVICE_BACKENDS.get(value.device.type)
                if runs is None or backend not in (None, runs):
                    wanted = f"backend {backend!r} needs {BACKEND_DEVICE_TYPES[backend]} tensors" if backend else \
                        "kernels run on cuda tensors (backend 'cuda') or cpu tensors (backend 'host')"
                    raise KernelArgumentError(f"{name}: on {value.device}; kernel {self.kernel_name}: {wanted}"
                                              f"{WHERE_ELSE.get((backend or '', runs or ''), '')}")
                return value.device
        raise KernelArgumentError(f"kernel {self.kernel_name}: no tensor argument to take the device from")

    def check_args(self, py_dict: Mapping[str, Any], backend: str | None = None) -> torch.device:
        self.check_keys(py_dict)
        device = self.get_device(py_dict, backend)
        for name, param in self.cparams.items():
            param.check(py_dict[name], device)
        return device

    def pack_args(self, py_dict: Mapping[str, Any]) -> tuple[np.generic, ...]:
        return tuple(p.pack(py_dict[name]) for name, p in self.cparams.items())

    def __call__(self, grid: tuple, block: tuple, py_dict: Mapping[str, Any], *, backend: str | None = None
                 ) -> None:
        """Launch with explicit grid/block; `py_dict` maps every parameter name to its value.

        Arrays are torch tensors, or arrays of other libraries (CuPy, NumPy, ...: anything with `__dlpack__` or
        `__cuda_array_interface__`), used in place without a copy. backend "cuda" runs on the arrays' GPU, on
        torch's current stream (CuPy's current stream when a CuPy array is among them); "host" runs the same
        source on the CPU through `autocuda.toolchain.host` (CPU arrays), for testing without a GPU; None (the default)
        picks the one of the arrays' device.
        """
        if torch.compiler.is_dynamo_compiling():
            return _eagerly(self.kernel_name, CKernel.__call__)(self, grid, block, py_dict, backend=backend)
        _refuse_unrecorded(self.kernel_name)
        with arrays.torch_views(py_dict, self._pointers(), backend) as args:
            self._launch_checked(grid, block, args, self.check_args(args, backend), backend)

    def _launch_checked(self, grid: tuple, block: tuple, args: Mapping[str, Any], device: torch.device,
                        backend: str | None) -> None:
        """Launch arguments that `check_args` passed, on `device`."""
        launch_dims(grid, "grid")  # sizes as the host runner checks them, on every backend
        launch_dims(block, "block")
        self.launch(grid, block, self.pack_args(args), device, backend or DEVICE_BACKENDS[device.type])
        # written in place through its address: autograd must see the change, as of any in-place op
        torch.autograd.graph.increment_version([args[name] for name, writes in self._pointers().items() if writes])

    def cuda_launch(self, device: int) -> Any:
        """The kernel's launcher on CUDA device `device` (`toolchain.launch.PackedLaunch`, compiled on first use),
        kept on the kernel: called with (grid, block, the arguments' values in parameter order, tensors as
        addresses, stream), it launches without the checks of `__call__` (for callers that make every tensor).
        One launcher per device, of the kernel as it is: a change to the source or the parameters compiles anew."""
        launches = self.__dict__.setdefault("_launches", {})
        made = (self.full_codes, self.kernel_name, tuple(self.cparams.values()))
        found = launches.get(device)
        if found is None or found[0] != made:
            from ..toolchain.launch import packed_launch

            found = launches[device] = (made, packed_launch(*made, device))
        return found[1]

    def _pointers(self) -> dict[str, bool]:
        """The pointer parameters, each with whether the kernel may write what it points to."""
        return {name: not param.const for name, param in self.cparams.items() if param.pointer}

    def _simple(self, backend: str | None, kwargs: Mapping[str, Any]) -> None:
        """`simple_call` of the 1-D and 2-D kernels: the checks, then their `_simple_call`."""
        if torch.compiler.is_dynamo_compiling():
            return _eagerly(self.kernel_name, CKernel._simple)(self, backend, kwargs)
        _refuse_unrecorded(self.kernel_name)
        with arrays.torch_views(kwargs, self._pointers(), backend) as views:
            # every argument checked as a launch checks it (the computed sizes aside), also where nothing runs
            device = self.check_args({**views, **{name: 0 for _, name in self.builtin_params}}, backend)
            packed = [name for name, p in self.cparams.items() if p.packed]
            plain = [name for name, p in self.cparams.items() if p.pointer and not p.packed]
            if packed and plain:  # the sizes count one kind of word: no one index addresses both
                raise KernelArgumentError(f"kernel {self.kernel_name}: simple_call counts one kind of word, but "
                                          f"{packed} point to packed words (half2, __nv_bfloat162) and {plain} to "
                                          f"single values: launch it as kernel(grid, block, {{...}}) with sizes "
                                          f"of your own")
            self._simple_call(views, device, backend)

    def _simple_call(self, kwargs: Mapping[str, Any], device: torch.device, backend: str | None) -> None:
        """The launch of checked arguments (on `device`): sizes, padding, and nothing where there is nothing to do."""
        raise NotImplementedError

    def launch(self, grid: tuple, block: tuple, packed: tuple, device: torch.device, backend: str = "cuda") -> None:
        """Launch with arguments already checked and packed in parameter order (the generated ops' fast path)."""
        _launcher(backend)(self.full_codes, self.kernel_name, tuple(self.cparams.values()), grid, block, packed,
                           device)


BACKEND_DEVICE_TYPES = {"cuda": "cuda", "host": "cpu"}
DEVICE_BACKENDS = {device: backend for backend, device in BACKEND_DEVICE_TYPES.items()}  # where backend is None
# What to do instead, by (backend asked for, backend the tensors' device needs)
WHERE_ELSE = {("cuda", "host"): " (leave backend out, or pass backend='host', to run the same source on CPU tensors "
                                "through the host runner)",
              ("host", "cuda"): " (leave backend out to run on the tensors' GPU)"}


_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def _refuse_unrecorded(name: str) -> None:
    """A launch reads and writes its arrays' memory: torch.jit.trace cannot record it, nor a torch.func transform
    (vmap, grad, ...) batch or differentiate it."""
    if torch._C._get_tracing_state() is not None:
        raise NotImplementedError(f"kernel {name!r}: torch.jit.trace records no launch (its trace would not run "
                                  "the kernel); launch it outside the trace")
    if _functorch_active():
        raise NotImplementedError(f"kernel {name!r}: a launch does not run under torch.func transforms (grad, vmap, "
                                  "jacrev, ...), which see no operation in it")


def _eagerly(name: str, method: Any) -> Any:
    """`method` as torch.compile runs it: outside the graph (a graph break, which fullgraph=True refuses), since a
    launch reads and writes memory through addresses, no operation a graph could hold."""
    return torch.compiler.disable(method, reason=f"kernel {name!r}: a launch reads and writes its tensors' memory, "
                                                 f"no operation torch.compile can trace")


def _launcher(backend: str):
    """The launch function of a backend: (source, name, params, grid, block, packed args, device) -> None."""
    if backend == "cuda":
        from ..toolchain.launch import launch
    elif backend == "host":
        from ..toolchain.host import launch
    else:
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKEND_DEVICE_TYPES)}")
    return launch


def _tidy(code: str) -> str:
    """User code as written in an indented triple-quoted string, flush left and without blank ends."""
    return textwrap.dedent(code).strip("\n")


def _packed_words(n: int, param: CParam) -> int:
    return math.ceil(n / 2) if param.packed else n


class _PaddedCall:
    """Odd element counts of packed (half2/bf16x2) tensors: pad to whole words, copy outputs back."""

    def __init__(self, kernel: CKernel, py_dict: Mapping[str, Any], row_dim: int):
        self.kernel, self.originals, self.row_dim = kernel, dict(py_dict), row_dim
        self.copies: dict[tuple, torch.Tensor] = {}
        self.args = {k: self._pad(k, v) for k, v in py_dict.items()}

    def _pad(self, name: str, value: Any) -> Any:
        param = self.kernel.cparams.get(name)  # an unknown name is reported by the launch's key check
        if not (param is not None and param.packed
                and isinstance(value, torch.Tensor) and value.shape and value.shape[-1] % 2):
            return value
        # One padded copy per tensor: arguments that are one tensor (y given as x too, in place) stay one memory in
        # the kernel, as with an even count
        key = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if key not in self.copies:
            self.copies[key] = torch.cat([value, value[..., -1:]], dim=-1)
        return self.copies[key]

    def finish(self) -> None:
        for name, value in self.args.items():
            param = self.kernel.cparams[name]
            if value is not self.originals[name] and not param.const:
                self.originals[name].copy_(value[..., : self.originals[name].shape[-1]])


class CKernel1D(CKernel):
    """Element-wise kernel: every tensor is a flat vector of `numel` words; `index` is the word."""

    template = "kernel1d.cu.j2"
    builtin_params = (("const long long", "numel"),)
    reserved_cnames = ("index", "numel", "backend")

    def simple_call(self, backend: str | None = None, **kwargs: Any) -> None:
        """Launch over all elements of tensors of one shape; `numel`, grid and block are computed from them.
        Arrays and `backend` as in `CKernel.__call__`."""
        self._simple(backend, kwargs)

    def _simple_call(self, kwargs: Mapping[str, Any], device: torch.device, backend: str | None) -> None:
        pointers = self._pointers()
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k in pointers}
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if len(set(shapes.values())) > 1:  # element i of one is element i of every other, in any layout
            raise KernelArgumentError(f"kernel {self.kernel_name}: an element-wise kernel's tensors have one "
                                      f"shape, got {shapes}")
        flat = {k: (v.reshape(-1) if isinstance(v, torch.Tensor) and v.is_contiguous() else v)
                for k, v in kwargs.items()}
        padded = _PaddedCall(self, flat | {"numel": 0}, row_dim=0)
        words = [_packed_words(v.numel(), self.cparams[k]) for k, v in tensors.items() if k in self.cparams]
        numel = max(words) if words else 0
        padded.args["numel"] = numel
        if numel:
            self._launch_checked(*launch_shape(numel), padded.args, device, backend)  # padded: as checked
            padded.finish()


class CKernel2D(CKernel):
    """Temporal kernel over [T, N] tensors: one thread per neuron word, a loop over time (`reverse` for BPTT).

    In the core, `t` is the flat offset of (time step, neuron) and `dt` the stride of one time step:
    `x[t - dt]` is the previous step of the same neuron.
    """

    template = "kernel2d.cu.j2"
    builtin_params = (("const long long", "numel"), ("const long long", "N"))
    reserved_cnames = ("index", "numel", "N", "dt", "t", "backend")

    def __init__(self, kernel_name: str, reverse: bool = False):
        super().__init__(kernel_name)
        self.reverse = reverse
        self.pre_core = ""
        self.post_core = ""

    def _context(self) -> dict[str, Any]:
        return super()._context() | {"reverse": self.reverse, "pre_core": _tidy(self.pre_core),
                                     "post_core": _tidy(self.post_core)}

    def simple_call(self, backend: str | None = None, **kwargs: Any) -> None:
        """Launch over [T, N] tensors (1-D tensors are per-neuron [N]); N, numel, grid and block computed.
        Arrays and `backend` as in `CKernel.__call__`."""
        self._simple(backend, kwargs)

    def _simple_call(self, kwargs: Mapping[str, Any], device: torch.device, backend: str | None) -> None:
        pointers = self._pointers()
        shapes = {k: tuple(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k in pointers}
        rows = {s for s in shapes.values() if len(s) == 2}
        if len(rows) != 1 or any(len(s) not in (1, 2) for s in shapes.values()):
            raise KernelArgumentError(f"kernel {self.kernel_name}: expected [T, N] tensors (and [N] ones) "
                                      f"all of one [T, N], got {shapes}")
        (T, n), = rows
        if any(len(s) == 1 and s[0] != n for s in shapes.values()):
            raise KernelArgumentError(f"kernel {self.kernel_name}: 1-D tensors must have N={n} elements: {shapes}")
        packed = any(p.packed for p in self.cparams.values())
        words = math.ceil(n / 2) if packed else n
        padded = _PaddedCall(self, dict(kwargs) | {"numel": T * words, "N": words}, row_dim=1)
        # T = 0 runs no step, but pre_core and post_core still run once per neuron (a sum over no steps is 0)
        if T * words or (words and (_tidy(self.pre_core) or _tidy(self.post_core))):
            self._launch_checked(*launch_shape(words), padded.args, device, backend)  # padded: as checked
            padded.finish()


def launch_shape(threads_needed: int, block: int = 256) -> tuple[tuple[int], tuple[int]]:
    """Grid and block for one thread per item."""
    return (max(1, math.ceil(threads_needed / block)),), (block,)
