"""A sympy expression as a flat program, evaluated with torch without sympy.

`spec.torch_eval.lower` writes an expression as a tuple of instructions, each an operation and its operands;
an operand that names another instruction is its index, always an earlier one, and the last instruction is the
value. `run` evaluates a program exactly as `spec.torch_eval.evaluate` evaluates the expression it was lowered
from (the same torch operations in the same order, the same scalar rules: tests/test_flat.py holds them equal),
so a process that keeps an expression's program (`autocuda.nn.flexsn`: an output that is an expression) never
imports sympy to evaluate it.

Instructions, by operation:
- ("symbol", name), ("number", value), ("true",), ("false",)
- ("add", i, j, ...), ("mul", i, j, ...), ("min", i, j, ...), ("max", i, j, ...): folded left to right
- ("pow", base, exponent, how): how is "sqrt" (exponent 1/2), "reciprocal" (-1), an int (an integer exponent)
  or None
- (function, i) for each function of FUNCTIONS
- ("heaviside", i, value at 0), ("piecewise", piece, condition, ...) with condition -1 for "otherwise"
- ("lt" | "le" | "gt" | "ge" | "eq" | "ne", i, j), ("and", i, j, ...), ("or", i, j, ...), ("not", i),
  ("ite", condition, then, otherwise)

A program read from the disk cache is untrusted: `check` verifies every instruction (a known operation, its
operand count and types, indices of earlier instructions, names the caller allows, at most MAX_INSTRUCTIONS)
before `run` sees it.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Union

import torch

__all__ = ["Program", "run", "check", "to_json", "from_json", "FUNCTIONS", "MAX_INSTRUCTIONS"]

Value = Union[torch.Tensor, float, bool]  # noqa: UP007 - used at runtime on py3.10 too
Program = tuple[tuple[Any, ...], ...]
MAX_INSTRUCTIONS = 20_000  # an expression's nodes (`spec.budget` bounds a spec's expressions to fewer terms)


def scalar_of(fn: Callable[..., torch.Tensor], scalar: Callable[..., float], *args: float) -> float:
    """A function of Python floats, by `math` (torch.compile folds it into a constant: no tensor, no .item());
    where math raises (exp overflow, log(0), a negative base's fractional power) torch's float64 value instead,
    so that scalars get inf and nan as tensors do."""
    try:
        return float(scalar(*args))
    except (ArithmeticError, ValueError):
        return fn(*(torch.tensor(a, dtype=torch.float64) for a in args)).item()


def reciprocal(value: float) -> float:
    return 1.0 / value


def sign(value: float) -> float:
    return value if value == 0 or math.isnan(value) else math.copysign(1.0, value)


def minimum(a: Value, b: Value) -> Value:
    """min(a, b) as torch.minimum: NaN where either is NaN, the gradient split evenly at a tie (as the kernels' min;
    torch.clamp would give it all to the tensor), a number taken as a 0-dim tensor (a CPU scalar, whatever a's
    device)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.minimum(*_tensors(a, b))
    return math.nan if a != a or b != b else min(a, b)  # Python's min would drop a NaN in the second place


def maximum(a: Value, b: Value) -> Value:
    """max(a, b) as torch.maximum (see `minimum`)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.maximum(*_tensors(a, b))
    return math.nan if a != a or b != b else max(a, b)


def _tensors(a: Value, b: Value) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b where one is a tensor: a number as a 0-dim tensor of the other's dtype."""
    if isinstance(a, torch.Tensor):
        return a, b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype)
    assert isinstance(b, torch.Tensor)  # one of them is
    return torch.tensor(a, dtype=b.dtype), b


# Each function of one argument: its torch function and its function of a Python float.
FUNCTIONS: Mapping[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[float], float]]] = {
    "exp": (torch.exp, math.exp), "expm1": (torch.expm1, math.expm1), "log": (torch.log, math.log),
    "abs": (torch.abs, abs), "sin": (torch.sin, math.sin), "cos": (torch.cos, math.cos),
    "tan": (torch.tan, math.tan), "tanh": (torch.tanh, math.tanh), "atan": (torch.atan, math.atan),
    "erf": (torch.erf, math.erf), "sign": (torch.sign, sign),
}
_RELATIONS: Mapping[str, Callable[[Any, Any], Any]] = {
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
}
_FOLDS: Mapping[str, Callable[[Value, Value], Value]] = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "min": minimum, "max": maximum}
_FOLD_START: Mapping[str, float] = {"add": 0.0, "mul": 1.0}  # the walker's sums and products start here
_LOGIC: Mapping[str, tuple[Callable[..., torch.Tensor], Callable[[list[Any]], bool]]] = {
    "and": (torch.logical_and, all), "or": (torch.logical_or, any)}


class Evaluation:
    """One evaluation of an expression with torch ops (a flat program here, a sympy tree in `torch_eval`): the
    values by name, their dtype and device (as `torch_eval.evaluate` finds them), and how numbers meet tensors."""

    def __init__(self, values: Mapping[str, Any], dtype: torch.dtype, device: torch.device):
        self.values, self.dtype, self.device = values, dtype, device

    def tensor(self, value: Value) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        return torch.tensor(value, dtype=torch.bool if isinstance(value, bool) else self.dtype, device=self.device)

    def unary(self, fn: Callable[[torch.Tensor], torch.Tensor], scalar: Callable[[float], float], value: Value
              ) -> Value:
        return fn(value) if isinstance(value, torch.Tensor) else scalar_of(fn, scalar, float(value))

    def logic(self, tensor_op: Callable[..., torch.Tensor], scalar_op: Callable[[list[Any]], bool],
              values: list[Value]) -> Value:
        """An and/or of `values`: Python's on numbers alone, else torch's, one pair at a time."""
        if not any(isinstance(v, torch.Tensor) for v in values):
            return scalar_op(values)
        combined = self.tensor(values[0])
        for v in values[1:]:
            combined = tensor_op(combined, self.tensor(v))
        return combined


class _Machine(Evaluation):
    """A flat program's evaluation: the results of its instructions so far."""

    def __init__(self, values: Mapping[str, Any], dtype: torch.dtype, device: torch.device):
        super().__init__(values, dtype, device)
        self.results: list[Value] = []

    def select(self, cond: Value, a: Value, b: Value) -> Value:
        if isinstance(cond, bool):
            return a if cond else b
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            a = self.tensor(a)  # torch.where(cond, 1.0, 2.0) would pick the default dtype, not ours
        return torch.where(cond, a, b)  # type: ignore[arg-type]  # the stubs want tensors; torch takes numbers

    def step(self, instruction: tuple[Any, ...]) -> Value:
        op, args, r = instruction[0], instruction[1:], self.results
        if op == "symbol":
            if args[0] not in self.values:
                raise TypeError(f"no value given for symbol {args[0]}")
            value = self.values[args[0]]
            return value if isinstance(value, torch.Tensor) else float(value)
        if op == "number":
            return float(args[0])
        if op in ("true", "false"):
            return op == "true"
        if op in _FOLDS:
            fold = _FOLDS[op]
            result = _FOLD_START[op] if op in _FOLD_START else r[args[0]]
            for i in (args if op in _FOLD_START else args[1:]):
                result = fold(result, r[i])
            return result
        if op == "pow":
            return self.power(r[args[0]], r[args[1]], args[2])
        if op in FUNCTIONS:
            return self.unary(*FUNCTIONS[op], r[args[0]])
        if op == "heaviside":
            z, at_zero = r[args[0]], float(args[1])
            if not isinstance(z, torch.Tensor):
                return 1.0 if z > 0 else (at_zero if z == 0 else 0.0)
            return torch.where(z > 0, self.tensor(1.0), torch.where(z == 0, self.tensor(at_zero), self.tensor(0.0)))
        if op == "piecewise":
            chosen: Value = math.nan  # sympy's value when no condition holds
            for piece, cond in reversed(list(zip(args[::2], args[1::2]))):
                chosen = r[piece] if cond == -1 else self.select(r[cond], r[piece], chosen)
            return chosen
        if op in _RELATIONS:
            return _RELATIONS[op](r[args[0]], r[args[1]])
        if op in _LOGIC:
            return self.logic(*_LOGIC[op], [r[i] for i in args])
        if op == "not":
            value = r[args[0]]
            return torch.logical_not(value) if isinstance(value, torch.Tensor) else not value
        if op == "ite":
            condition, then, otherwise = (r[i] for i in args)
            if not isinstance(condition, torch.Tensor):
                return then if condition else otherwise
            return torch.where(condition, torch.as_tensor(then), torch.as_tensor(otherwise))
        raise ValueError(f"unknown operation {op!r}")

    def power(self, b: Value, x: Value, how: Any) -> Value:
        if how == "sqrt":
            return self.unary(torch.sqrt, math.sqrt, b)
        if how == "reciprocal":
            return self.unary(torch.reciprocal, reciprocal, b)
        if isinstance(how, int) and isinstance(b, torch.Tensor):
            return b ** how  # integer powers stay exact and defined for negative bases
        if isinstance(b, torch.Tensor) or isinstance(x, torch.Tensor):
            return torch.pow(b, x)  # type: ignore[arg-type]
        return scalar_of(torch.pow, math.pow, b, x)


def run(program: Program, values: Mapping[str, torch.Tensor | float]) -> torch.Tensor:
    """The value of a (checked) program, each symbol its entry in `values` (a tensor or a number), as
    `torch_eval.evaluate` gives the value of the expression it was lowered from."""
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    dtype = torch.bool
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    if not dtype.is_floating_point:  # all-integer or no tensor inputs: compute in torch's default float
        dtype = torch.get_default_dtype()
    device = tensors[0].device if tensors else torch.device("cpu")
    machine = _Machine(values, dtype, device)
    for instruction in program:
        machine.results.append(machine.step(instruction))
    result = machine.results[-1]
    if isinstance(result, torch.Tensor):
        return result if result.is_floating_point() or result.dtype == torch.bool else result.to(dtype)
    return torch.tensor(result, dtype=torch.bool if isinstance(result, bool) else dtype, device=device)


# -- checking a program read back ---------------------------------------------------------------------------
def _index(value: object, at: int, allow_otherwise: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return 0 <= value < at or (allow_otherwise and value == -1)


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)


def _problem(instruction: object, at: int, names: Collection[str]) -> str | None:
    """Why `instruction`, the `at`-th of a program, is not one `lower` writes (None: it is)."""
    if not isinstance(instruction, (list, tuple)) or not instruction or not isinstance(instruction[0], str):
        return "expected [operation, operands...]"
    op, args = instruction[0], list(instruction[1:])
    if op == "symbol":
        return None if len(args) == 1 and args[0] in names else f"a symbol of {sorted(names)} expected"
    if op == "number":
        return None if len(args) == 1 and _number(args[0]) else "one number (not nan) expected"
    if op in ("true", "false"):
        return None if not args else "no operands expected"
    if op in _FOLDS or op in _LOGIC:
        return None if len(args) >= 2 and all(_index(i, at) for i in args) else "two or more earlier indices expected"
    if op == "pow":
        how_ok = args[2:3] and (args[2] in ("sqrt", "reciprocal", None) or
                                (isinstance(args[2], int) and not isinstance(args[2], bool)))
        ok = len(args) == 3 and _index(args[0], at) and _index(args[1], at) and how_ok
        return None if ok else "base, exponent (earlier indices) and how expected"
    if op in FUNCTIONS or op == "not":
        return None if len(args) == 1 and _index(args[0], at) else "one earlier index expected"
    if op == "heaviside":
        return None if len(args) == 2 and _index(args[0], at) and _number(args[1]) else "an index and a number expected"
    if op == "piecewise":
        ok = args and len(args) % 2 == 0 and all(_index(p, at) for p in args[::2]) and \
            all(_index(c, at, allow_otherwise=True) for c in args[1::2])
        return None if ok else "pieces and conditions (earlier indices, -1: otherwise) expected"
    if op in _RELATIONS:
        return None if len(args) == 2 and all(_index(i, at) for i in args) else "two earlier indices expected"
    if op == "ite":
        return None if len(args) == 3 and all(_index(i, at) for i in args) else "three earlier indices expected"
    return f"unknown operation {op!r}"


def check(program: object, names: Collection[str]) -> Program:
    """`program` as a Program when every instruction is one `lower` writes, over symbols of `names`; else a
    ValueError naming the first instruction that is not."""
    if not isinstance(program, (list, tuple)) or not 0 < len(program) <= MAX_INSTRUCTIONS:
        raise ValueError(f"expected a list of 1 to {MAX_INSTRUCTIONS} instructions")
    for at, instruction in enumerate(program):
        problem = _problem(instruction, at, names)
        if problem is not None:
            raise ValueError(f"instruction {at} ({str(instruction)[:80]}): {problem}")
    return tuple(tuple(instruction) for instruction in program)


def to_json(program: Program) -> bytes:
    return json.dumps(program).encode()


def from_json(data: bytes, names: Collection[str]) -> Program:
    """A program stored by `to_json`, checked (`check`); ValueError where it is not one."""
    try:
        program = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"not a JSON program ({type(error).__name__})") from None
    return check(program, names)


def symbols_of(program: Sequence[tuple[Any, ...]]) -> set[str]:
    """The names a program reads."""
    return {instruction[1] for instruction in program if instruction[0] == "symbol"}
