"""Untrusted expression text -> sympy, through a whitelist of Python `ast` nodes.

Spec expressions end up inside CUDA source, so the text is never handed to eval, sympify or any parser that
can run code. We parse it with `ast.parse(mode='eval')`, measure the tree, and build sympy objects node by
node from a whitelist; everything else is a SpecError naming the source, the field and the offending token.

Grammar accepted: numbers (finite, |v| <= 1e30), names from the caller's symbol table plus `pi` and `e`,
`+ - * / **`, unary `+ -`, calls of the functions in FUNCTIONS (fixed arity, positional only),
`where(a < b, then, else)` (the only place a comparison may appear), `A if opt else B` where `opt`
is a compile-time option, resolved here, and where the caller allows them (`draws`), the random draws `randn()` and
`rand()` (`spec.draws`: each call a symbol of its own, numbered left to right from 0).
"""
from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import sympy

from ..base.errors import SpecError
from . import budget
from .draws import DRAW_FUNCTIONS, draw_refusal, draw_symbol
from .names import LANGUAGE_NAMES, check_identifier

__all__ = ["parse_expression", "check_identifier", "FUNCTIONS", "CONSTANTS", "RESERVED_NAMES", "DRAW_FUNCTIONS"]

MAX_TEXT = 2000
MAX_DEPTH = 64  # expression nodes from root to leaf; a neuron equation needs a handful
MAX_MAGNITUDE = budget.MAX_MAGNITUDE
MAX_INT_DIGITS = 30
_NO_OPTIONS: Mapping[str, bool] = MappingProxyType({})


def _sigmoid(z: sympy.Expr) -> sympy.Expr:
    return 1 / (1 + sympy.exp(-z))


def _heaviside(z: sympy.Expr) -> sympy.Expr:
    return sympy.Heaviside(z, 1)  # Θ(0) = 1, as the default spike rule s = Θ(h - v_th) (fires_at ">=")


# name -> (min args, max args or None for unbounded, builder)
FUNCTIONS: Mapping[str, tuple[int, int | None, Callable[..., sympy.Expr]]] = MappingProxyType({
    "exp": (1, 1, lambda z: _exp(z)),
    "log": (1, 1, sympy.log),
    "sqrt": (1, 1, sympy.sqrt),
    "abs": (1, 1, sympy.Abs),
    "sin": (1, 1, sympy.sin),
    "cos": (1, 1, sympy.cos),
    "tan": (1, 1, sympy.tan),
    "tanh": (1, 1, sympy.tanh),
    "atan": (1, 1, sympy.atan),
    "sigmoid": (1, 1, _sigmoid),
    "erf": (1, 1, sympy.erf),
    "heaviside": (1, 1, _heaviside),
    "min": (2, None, sympy.Min),
    "max": (2, None, sympy.Max),
    "where": (3, 3, lambda c, a, b: sympy.Piecewise((a, c), (b, True))),
})
CONDITION_FUNCTIONS = frozenset({"where"})  # their first argument is a comparison

CONSTANTS: Mapping[str, sympy.Expr] = MappingProxyType({"pi": sympy.pi, "e": sympy.E})

_BINARY = {ast.Add: sympy.Add, ast.Sub: lambda a, b: a - b, ast.Mult: sympy.Mul,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: _power(a, b)}
_BINARY_TOKENS = {ast.Mod: "%", ast.FloorDiv: "//", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
                  ast.BitOr: "|", ast.BitXor: "^", ast.BitAnd: "&"}
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a}
_COMPARE = {ast.Lt: sympy.StrictLessThan, ast.LtE: sympy.LessThan,
            ast.Gt: sympy.StrictGreaterThan, ast.GtE: sympy.GreaterThan}

# Names a spec may not declare: the functions and constants above, listed without sympy in `spec.names` (which
# checks a spec's names on every construction); tests/test_security_names.py holds the two lists equal.
RESERVED_NAMES = LANGUAGE_NAMES


def parse_expression(text: str, symbols: Mapping[str, sympy.Basic], *, source: str = "<python>",
                     field: str = "", options: Mapping[str, bool] = _NO_OPTIONS, draws: bool = False) -> sympy.Expr:
    """Parse one expression of the spec language into sympy, refusing anything outside the whitelist (the random
    draws `randn()` and `rand()` too, unless `draws`). A text
    parsed before in this process, with the same symbols and options for the names it uses, gives the same
    expression without building it again (a traced step's expressions are parsed back to check their text, then
    again as its spec's; sympy's min and max take milliseconds each to build)."""
    tree = _parse_tree(text, source=source, field=field)
    key = (_parse_key(text, tree, symbols, options), draws)
    found = _parsed.get(key)
    if found is None:
        found = budget.bounded(source, field, _Builder(text, symbols, options, source, field, draws).build, tree.body)
        if len(_parsed) >= MAX_PARSED:
            _parsed.clear()
        _parsed[key] = found
    return found


MAX_PARSED = 4096  # texts kept by `parse_expression`
_parsed: dict[tuple, sympy.Expr] = {}


def _parse_key(text: str, tree: ast.Expression, symbols: Mapping[str, sympy.Basic], options: Mapping[str, bool]
               ) -> tuple:
    """What the parse of `text` depends on: the text, and the symbol and the option value of each name it uses
    (the rest of the tables does not change the expression)."""
    used = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)})
    return (text.strip(), tuple((n, symbols[n]) for n in used if n in symbols),
            tuple((n, bool(options[n])) for n in used if n in options))


def _parse_tree(text: object, *, source: str, field: str) -> ast.Expression:
    if not isinstance(text, str):
        raise SpecError(f"expected an expression string, got {type(text).__name__}", source=source, field=field)
    if len(text) > MAX_TEXT:
        raise SpecError(f"expression longer than {MAX_TEXT} characters", source=source, field=field)
    if not text.strip():
        raise SpecError("empty expression", source=source, field=field)
    if not text.isascii():  # Python folds some Unicode letters into ASCII names (NFKC); allow none at all
        bad = next(c for c in text if not c.isascii())
        raise SpecError(f"non-ASCII character {bad!r}", source=source, field=field, symbol=bad)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning on odd escapes inside (refused) strings
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise SpecError(f"syntax error: {err.msg}", source=source, field=field, symbol=err.text) from None
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes; absurd nesting in the parser
        raise SpecError(f"cannot parse expression ({type(err).__name__})", source=source, field=field) from None
    _check_depth(tree, source=source, field=field)
    return tree


def _check_depth(tree: ast.AST, *, source: str, field: str) -> None:
    # Iterative, so a deep tree is reported instead of overflowing the stack of the builder below.
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SpecError(f"expression nested deeper than {MAX_DEPTH} levels", source=source, field=field)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))


def _power(base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
    # sympy evaluates powers eagerly and exactly: (2*v)**(10**29) builds a 10**29-bit integer in one C call.
    problem = budget.check_exponent(exponent)
    if problem is None and base.is_Number and exponent.is_Number and base != 0:
        magnitude = abs(float(exponent)) * abs(math.log10(abs(float(base))))
        problem = "numeric power out of range" if magnitude > math.log10(MAX_MAGNITUDE) else None
    if problem is not None:
        raise ValueError(problem)
    return sympy.Pow(base, exponent)


def _exp(argument: sympy.Expr) -> sympy.Expr:
    problem = budget.exp_problem(argument)  # sympy rewrites exp(c*log(b)) as the power b**c
    if problem is not None:
        raise ValueError(problem)
    return sympy.exp(argument)


class _Builder:
    """One walk over one tree: node -> sympy, dispatching on the node type through a table."""

    def __init__(self, text: str, symbols: Mapping[str, sympy.Basic], options: Mapping[str, bool],
                 source: str, field: str, draws: bool = False):
        self.text, self.symbols, self.options = text, symbols, options
        self.source, self.field = source, field
        self.draws, self.sites = draws, 0  # whether draws are allowed; the draws made so far

    def refuse(self, message: str, node: ast.AST | None = None, symbol: str | None = None) -> SpecError:
        if symbol is None and node is not None:
            symbol = (ast.get_source_segment(self.text.strip(), node) or type(node).__name__)[:60]
        return SpecError(message, source=self.source, field=self.field, symbol=symbol)

    def build(self, node: ast.AST) -> sympy.Expr:
        method = self._DISPATCH.get(type(node))
        if method is None:
            what = _NODE_NAMES.get(type(node), type(node).__name__)
            hint = _HINTS.get(type(node))
            raise self.refuse(f"{what} not allowed in an expression{hint(node) if hint else ''}", node)
        try:
            result = method(self, node)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError) as err:
            if isinstance(err, SpecError):
                raise
            raise self.refuse(f"invalid arithmetic: {err}", node) from None
        return self._checked(result, node)

    def _checked(self, result: sympy.Expr, node: ast.AST) -> sympy.Expr:
        if result.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            raise self.refuse("division by zero or an infinite value", node)
        if result.has(sympy.I):
            raise self.refuse("a complex value (e.g. sqrt or log of a negative number)", node)
        problem = budget.check_node(result)
        if problem is not None:
            raise self.refuse(problem, node)
        return result

    def _constant(self, node: ast.Constant) -> sympy.Expr:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.refuse(f"constant {value!r} not allowed (only int and float numbers)", node)
        if isinstance(value, int):
            if len(str(abs(value))) > MAX_INT_DIGITS:
                raise self.refuse(f"integer literal with more than {MAX_INT_DIGITS} digits", node)
            return sympy.Integer(value)
        if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            raise self.refuse(f"number out of range (|value| <= {MAX_MAGNITUDE:g})", node)
        return sympy.Float(value)

    def _name(self, node: ast.Name) -> sympy.Expr:
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in self.symbols:
            return self.symbols[node.id]
        if node.id in FUNCTIONS or node.id in DRAW_FUNCTIONS:
            raise self.refuse(f"function '{node.id}' used without calling it", node, node.id)
        if node.id in self.options:
            raise self.refuse(f"option '{node.id}' may only be used as `A if {node.id} else B`", node, node.id)
        known = ", ".join([*self.symbols, *CONSTANTS])
        raise self.refuse(f"unknown name '{node.id}' (known: {known})", node, node.id)

    def _binop(self, node: ast.BinOp) -> sympy.Expr:
        op = _BINARY.get(type(node.op))
        if op is None:
            token = _BINARY_TOKENS.get(type(node.op), type(node.op).__name__)
            raise self.refuse(f"operator '{token}' not allowed", node, token)
        return op(self.build(node.left), self.build(node.right))

    def _unaryop(self, node: ast.UnaryOp) -> sympy.Expr:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise self.refuse(f"unary operator {type(node.op).__name__} not allowed", node)
        return op(self.build(node.operand))

    def _call(self, node: ast.Call) -> sympy.Expr:
        if not isinstance(node.func, ast.Name):
            raise self.refuse("only calls of whitelisted functions by name are allowed", node.func)
        name = node.func.id
        if name in DRAW_FUNCTIONS:
            return self._draw(node, name)
        if name not in FUNCTIONS:
            raise self.refuse(f"unknown function '{name}' (allowed: {', '.join(FUNCTIONS)})", node, name)
        low, high, builder = FUNCTIONS[name]
        if node.keywords:
            raise self.refuse(f"keyword arguments not allowed in '{name}(...)'", node, name)
        count = len(node.args)
        if count < low or (high is not None and count > high):
            expected = f"{low}" if low == high else f"at least {low}"
            raise self.refuse(f"'{name}' takes {expected} argument(s), got {count}", node, name)
        args = list(node.args)
        first = self._condition(args.pop(0)) if name in CONDITION_FUNCTIONS else None
        values = [self.build(arg) for arg in args]
        return builder(first, *values) if first is not None else builder(*values)

    def _draw(self, node: ast.Call, name: str) -> sympy.Expr:
        """A random draw: a symbol of its own per call (`spec.draws`)."""
        if not self.draws:
            raise self.refuse(draw_refusal(self.field), node, name)
        if node.args or node.keywords:
            raise self.refuse(f"'{name}()' takes no arguments (one draw per neuron and step)", node, name)
        self.sites += 1
        return draw_symbol(DRAW_FUNCTIONS[name], self.sites - 1)

    def _condition(self, node: ast.AST) -> sympy.Basic:
        if not isinstance(node, ast.Compare):
            raise self.refuse("the first argument of where() must be a comparison like `a < b`", node)
        if len(node.ops) != 1:
            raise self.refuse("chained comparisons not allowed; compare two expressions", node)
        relation = _COMPARE.get(type(node.ops[0]))
        if relation is None:
            raise self.refuse("only <, <=, >, >= comparisons are allowed", node)
        return relation(self.build(node.left), self.build(node.comparators[0]))

    def _ifexp(self, node: ast.IfExp) -> sympy.Expr:
        test = node.test
        if not (isinstance(test, ast.Name) and test.id in self.options):
            known = ", ".join(self.options) or "none declared"
            raise self.refuse(f"`A if flag else B` needs a compile-time option as flag (options: {known})",
                              test)
        chosen, other = (node.body, node.orelse) if self.options[test.id] else (node.orelse, node.body)
        self.build(other)  # the branch not taken must still be valid: catch typos in either setting
        return self.build(chosen)

    _DISPATCH: dict[type, Callable[[_Builder, Any], sympy.Expr]] = {
        ast.Constant: _constant, ast.Name: _name, ast.BinOp: _binop, ast.UnaryOp: _unaryop,
        ast.Call: _call, ast.IfExp: _ifexp,
    }


_NODE_NAMES = {
    ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
    ast.ListComp: "comprehension", ast.SetComp: "comprehension", ast.DictComp: "comprehension",
    ast.GeneratorExp: "comprehension", ast.JoinedStr: "f-string", ast.Starred: "starred argument",
    ast.NamedExpr: "assignment expression", ast.BoolOp: "boolean operator", ast.Compare: "comparison",
    ast.Tuple: "tuple", ast.List: "list", ast.Dict: "dict", ast.Set: "set", ast.Await: "await",
    ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slice", ast.FormattedValue: "f-string",
}
# What to write instead of a refused node, where the language has a way to say it.
_HINTS: dict[type, Callable[[Any], str]] = {
    ast.Compare: lambda node: f" (a comparison chooses between two values: write where({ast.unparse(node)}, a, b), "
                              f"which is a where it holds, else b)",
}
