"""The caches that spare repeated symbolic work between the kernels of one spec (bench/derive_speed.py measures it):
each gives what the uncached work gives, and the work is not done again. tests/test_golden.py proves the kernels'
texts unchanged."""
from __future__ import annotations

import sympy as sp

from autocuda.codegen import builder
from autocuda.codegen.builder import Builder
from autocuda.codegen.dtypes import FLOAT32, FLOAT32_UNDER_HALF, FLOAT64, get_dtype
from autocuda.codegen.kernels import derivation
from autocuda.codegen.options import KernelOptions
from autocuda.codegen.printer import CudaPrinter
from autocuda.spec import derive, draws
from autocuda.spec.load import load_spec
from autocuda.spec.system import step_system

x, y, z = sp.symbols("x y z", real=True)


def _counting_prints(monkeypatch) -> list[sp.Basic]:
    """The top-level expressions CudaPrinter prints from now on (cached ones are not printed)."""
    printed: list[sp.Basic] = []
    inner = CudaPrinter.print

    def counted(self, expr):
        if not printed or printed[-1] is not expr:
            printed.append(expr)
        return inner(self, expr)
    monkeypatch.setattr(CudaPrinter, "print", counted)
    return printed


def test_a_text_is_printed_once_per_dtype_and_names(monkeypatch):
    expr = sp.exp(x * y + 3 * z) / (x - z)
    first = CudaPrinter(FLOAT64, {x: "a", y: "b", z: "c"})(expr)
    printed = _counting_prints(monkeypatch)
    assert CudaPrinter(FLOAT64, {x: "a", y: "b", z: "c", sp.Symbol("w"): "w"})(expr) == first
    assert not printed  # the same dtype and names for its symbols: the text printed before
    other = CudaPrinter(FLOAT64, {x: "a", y: "B", z: "c"})(expr)
    assert other == first.replace("b", "B") and printed  # another name: printed again, with it


def test_dtypes_of_one_name_keep_their_own_texts():
    """float32 storage and the float arithmetic of half storage are both named float32, with their own exp."""
    expr = sp.exp(x) + 1
    assert "expf(" in CudaPrinter(FLOAT32, {x: "x"})(expr)
    assert "__expf(" in CudaPrinter(FLOAT32_UNDER_HALF, {x: "x"})(expr)
    assert "__expf(" not in CudaPrinter(FLOAT32, {x: "x"})(expr)


def test_the_detached_derivation_takes_no_partial_derivative_again(monkeypatch):
    """With and without detach_reset, the adjoint's partial derivatives are the same: taken once."""
    system = step_system(load_spec("alif"), "soft")
    without = derive.derive(system, False)
    calls = []
    inner = sp.diff
    monkeypatch.setattr(sp, "diff", lambda *args: calls.append(args) or inner(*args))
    detached = derive.derive(system, True)
    assert not calls
    assert detached.backward != without.backward  # the reset's path is cut: another adjoint


def test_kernels_of_one_derivation_hoist_and_find_draws_once(monkeypatch):
    """A second kernel of a derivation (another dtype) walks none of its expressions to hoist invariants or find
    the step's draws, and hoists the same invariants under the same names."""
    d = derivation(load_spec("noisy_cuba_lif"))
    assert draws.system_draws(d.system)  # a step that draws

    def hoisted(dtype: str) -> dict:
        b = Builder(d, KernelOptions("fptt", get_dtype(dtype)))
        b.draws()
        for e in (d.forward.charge, *d.forward.new_states):
            b.hoist(e)
        return b.invariants

    first = hoisted("float32")
    walks = []
    monkeypatch.setattr(draws, "draws_of", lambda exprs: walks.append(exprs))
    parts = builder.invariant_parts.cache_info()
    assert hoisted("float64") == first and not walks
    assert builder.invariant_parts.cache_info().misses == parts.misses
