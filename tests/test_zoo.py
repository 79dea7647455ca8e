"""The neuron zoo (issue 9): each shipped spec says what it integrates, compiles with nvcc (one translation unit
per dtype), and its kernels match the reference on the host runner. A new ODE neuron takes <= 10 lines of TOML.

The oracle of tests/test_derive.py and the property tests of tests/test_host_neurons.py parametrize over every
shipped spec, so they cover the zoo too; here the host check is a short one (two dtypes, one reset).
tests/test_neuron_compile.py nvcc-checks the zoo's kernels by default; here every dtype's, with --slow.
"""
from __future__ import annotations

import functools
import textwrap

import pytest
from conftest import compile_checked, compile_together, profile

from autocuda.codegen.dtypes import DTYPES
from autocuda.codegen.kernels import neuron_kernel
from autocuda.codegen.neuron_kernel import KERNELS
from autocuda.spec import NeuronSpec, list_specs, load_spec
from autocuda.spec.model import reset_rules
from autocuda.tools.testing import check_spec

ZOO = {  # name: (integration method, states)
    "cuba_lif": ("exact", ["v", "i"]),
    "sfa_lif": ("exact", ["v", "w"]),
    "resonate_fire": ("exact", ["v", "u"]),
    "fitzhugh_nagumo": ("euler", ["v", "w"]),
    "two_compartment": ("exact", ["v", "d"]),
}
HOST = {"dtypes": ("float64", "float32"), "resets": ("hard",), "detach": (False,), "examples": 2}

# The <= 10-line tutorial of docs/ode.md: a conductance-based LIF (v's coefficient depends on g, so the
# automatic method is exponential Euler).
USER_TOML = """\
doc = "Conductance-based LIF (COBA): x opens a conductance g that pulls v towards E"
reset = "soft"
params = { tau = 2.0, tau_g = 5.0, E = 3.0, v_threshold = 1.0 }
states = { v = 0.0, g = 0.0 }
[ode]
v = "(-v - g * (v - E)) / tau"
g = "-g / tau_g + x"
"""


def test_zoo_is_shipped_with_one_line_docs():
    shipped = dict(list_specs())
    for name, (method, states) in ZOO.items():
        spec = load_spec(name)
        assert shipped[name] and "\n" not in shipped[name] and spec.doc == shipped[name]
        assert [s.name for s in spec.states] == states and dict(spec.ode).keys() == set(states)
        assert spec.parsed().method == method, name
        assert spec.with_defaults(time_step=0.25).params != spec.params


def _sources(specs: list[NeuronSpec], dtype: str) -> str:
    """Every kernel kind of every spec (hard reset; other variants differ only in their equations, and
    tests/test_neuron_compile.py compiles them for the shipped specs: see there), one definition per name."""
    kernels = {k.kernel_name: k.full_codes for spec in specs for k in (neuron_kernel(spec, kind, dtype)
                                                                         for kind in KERNELS)}
    return "\n".join(kernels.values())


@pytest.mark.skipif(profile() != "slow", reason="by default tests/test_neuron_compile.py nvcc-checks these kernels "
                    "(test_the_zoo_kernels_are_in_the_default_nvcc_check): runs with --slow")
def test_zoo_kernels_compile(nvcc):
    specs = [load_spec(name) for name in ZOO]
    failures = compile_together(nvcc, {dtype: _sources(specs, dtype) for dtype in DTYPES}, archs=("sm_80",))
    assert not failures, "\n\n".join(f"{d}:\n{m[:3000]}" for d, m in failures.items())


def test_the_zoo_kernels_are_in_the_default_nvcc_check():
    """By default tests/test_neuron_compile.py checks every kernel kind of every zoo spec (own reset, default options)
    in float32 and float64: its equations printed in each arithmetic type (float16 and bfloat16 print them as float32
    does, and what they add does not depend on the spec: see there). So test_zoo_kernels_compile runs with --slow."""
    import test_neuron_compile as compiled

    for dtype in ("float32", "float64"):
        checked = set(compiled.default_set(dtype))
        for name in ZOO:
            spec = load_spec(name)
            for kind in KERNELS:
                options = compiled._options(reset=reset_rules(spec)[0], detach_reset=False)
                assert (name, kind, options) in checked, (name, kind, dtype)
                assert neuron_kernel(spec, kind, dtype, **dict(options)).full_codes \
                    == neuron_kernel(spec, kind, dtype).full_codes


def test_zoo_kernels_match_reference_on_host():
    """(The kernels of every spec's cases compiled up front, many to a compiler run: `conftest.compile_checked`.)"""
    specs = [load_spec(name) for name in ZOO]
    compile_checked(*(functools.partial(check_spec, spec, backend="host", **HOST) for spec in specs))
    for spec in specs:
        report = check_spec(spec, backend="host", **HOST)
        assert report.passed, report.describe()


def test_new_ode_neuron_in_ten_lines(tmp_path, nvcc):
    assert len(USER_TOML.splitlines()) <= 10
    path = tmp_path / "coba_lif.toml"
    path.write_text(textwrap.dedent(USER_TOML))
    spec = load_spec(path)
    assert spec.name == "coba_lif" and spec.parsed().method == "exponential_euler"
    failures = nvcc({"float32": _sources([spec], "float32")}, archs=("sm_80",))
    assert not failures, failures
    report = check_spec(spec, backend="host", dtypes=("float64", "float32"), resets=("soft",), detach=(False,),
                        examples=2)
    assert report.passed, report.describe()
