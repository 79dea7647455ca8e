"""NeuronSpec: shipped specs load and say what SpikingJelly says; TOML and Python agree; every rule is enforced."""
from __future__ import annotations

import dataclasses
import pickle
import textwrap
from pathlib import Path

import pytest
import sympy

from autocuda.base.errors import SpecError
from autocuda.base.resources import resource_dir
from autocuda.spec import NeuronSpec, Param, State, list_specs, load_spec
from autocuda.spec.surrogate import ATan, Custom, Sigmoid

SHIPPED = ["activation_aware_if", "adex", "alif", "clif", "conductance_lif", "cuba_lif", "cuba_lif_discrete", "dsr",
           "eif", "fitzhugh_nagumo", "gated_lif", "if", "ilif", "izhikevich", "klif", "liaf", "lif", "noisy_cuba_lif",
           "nonspiking_if", "nonspiking_lif", "parametric_lif", "qif", "raf", "resonate_fire", "sfa_lif", "stbif",
           "ternary_if", "ternary_lif", "two_compartment"]
# Specs that never reset (their output is the membrane, or the reset is an update or in the charge), and the
# membrane of each
NO_RESET = {"clif": "v_charged", "nonspiking_if": "v", "nonspiking_lif": "v", "gated_lif": "v"}
SOFT_RESET = {"ilif", "stbif", "dsr"}  # SpikingJelly's ILIFNode has no v_reset; STBIF and DSR subtract
MEMBRANES = {**NO_RESET, "stbif": "q"}  # the specs whose membrane is not v
RAW_THRESHOLD = {"gated_lif"}  # whose v_threshold is learned before a sigmoid (0.0: a threshold of 0.5)
sym = sympy.symbols("x v w a h s tau v_reset v_rest v_c a0 delta_T theta_rh tau_w R b beta tau_a v_threshold",
                    real=True)
(x, v, w, a, h, s, tau, v_reset, v_rest, v_c, a0, delta_T, theta_rh, tau_w, R, b, beta, tau_a,
 v_threshold) = sym


def same(e1: sympy.Expr, e2: sympy.Expr) -> bool:
    return sympy.simplify(e1 - e2) == 0


def write(tmp_path: Path, text: str, name: str = "neuron.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_shipped_specs_are_listed_with_docs():
    listed = list_specs()
    assert [n for n, _ in listed] == SHIPPED
    assert all(doc and "\n" not in doc for _, doc in listed)
    assert sorted(p.stem for p in resource_dir("neuron_specs").glob("*.toml")) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_loads(name):
    spec = load_spec(name)
    assert spec.name == name and spec.origin == f"{name}.toml"
    reset = "none" if name in NO_RESET else "soft" if name in SOFT_RESET else "hard"
    assert spec.surrogate == Sigmoid(alpha=4.0) and spec.reset == reset
    assert spec.membrane == MEMBRANES.get(name, "v")
    assert spec.parsed().membrane == sympy.Symbol(spec.membrane, real=True)
    assert load_spec(name.upper()) is spec  # cached, case-insensitive
    defaults = {p.name: p.default for p in spec.params}
    assert defaults.get("v_threshold", 1.0) == (0.0 if name in RAW_THRESHOLD else 1.0)


CHARGES = {
    "if": v + x,
    "lif": v + (x - (v - v_reset)) / tau,
    "qif": v + (x + a0 * (v - v_rest) * (v - v_c)) / tau,
    "eif": v + (x + v_rest - v + delta_T * sympy.exp((v - theta_rh) / delta_T)) / tau,
    "izhikevich": v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau,
    "adex": v + (-(v - v_rest) + delta_T * sympy.exp((v - theta_rh) / delta_T) + R * x - w) / tau,
    "alif": v + (x - (v - v_reset)) / tau,
    "parametric_lif": v + (x - (v - v_reset)) / (1 + sympy.exp(-w)),
}
DEFAULTS = {  # design.md §4 (SpikingJelly)
    "if": {"v_reset": 0.0},
    "lif": {"tau": 2.0, "v_reset": 0.0},
    "parametric_lif": {"w": 0.0, "v_reset": 0.0},
    "qif": {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_rest": 0.0, "v_reset": -0.1},
    "eif": {"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_rest": 0.0, "v_reset": -0.1},
    "izhikevich": {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_reset": 0.0, "v_rest": -0.1, "tau_w": 2.0, "a": 0.0,
                   "b": 0.0},
}


@pytest.mark.parametrize("name", list(CHARGES))  # the zoo's ODE forms are checked in tests/test_ode.py
def test_shipped_equations(name):
    parsed = load_spec(name).parsed()
    assert same(parsed.charge_expanded, CHARGES[name])
    assert set(DEFAULTS.get(name, {}).items()) <= {(p.name, p.default) for p in load_spec(name).params}


def test_lif_options_and_parametric_lif():
    lif = load_spec("lif")
    assert dict(lif.options) == {"decay_input": True}
    assert same(lif.with_options(decay_input=False).parsed().charge, v - (v - v_reset) / tau + x)
    plif = load_spec("parametric_lif")
    (wp,) = [p for p in plif.params if p.name == "w"]
    assert wp.kind == "tensor" and wp.learnable
    assert same(plif.with_options(decay_input=False).parsed().charge_expanded,
                v - (v - v_reset) / (1 + sympy.exp(-w)) + x)
    parsed = plif.parsed()
    assert parsed.charge.has(parsed.derived_symbols["decay"]) and not parsed.charge_expanded.has(
        parsed.derived_symbols["decay"])


def test_two_state_neurons():
    izh = load_spec("izhikevich").parsed()
    assert list(izh.state_symbols) == ["v", "w"]
    assert same(izh.updates["w"], w + (a * (h - v_rest) - w) / tau_w + b * s)
    adex = load_spec("adex").parsed()
    assert same(adex.updates["w"], w + (a * (h - v_rest) - w) / tau_w + b * s)
    alif = load_spec("alif").parsed()
    assert same(alif.threshold, v_threshold + beta * a)
    assert same(alif.updates_expanded["a"], sympy.exp(-1 / tau_a) * a + s)


def izhikevich_in_python() -> NeuronSpec:
    return NeuronSpec(
        name="izhikevich", doc="Izhikevich neuron (SpikingJelly IzhikevichNode): quadratic membrane with a recovery "
                               "current w",
        params={"tau": {"default": 2.0, "domain": "> 0"}, "v_c": 0.8, "a0": 1.0, "v_rest": -0.1,
                "tau_w": {"default": 2.0, "domain": "> 0"}, "a": 0.0, "b": 0.0, "v_threshold": 1.0, "v_reset": 0.0},
        states={"v": "v_reset", "w": 0.0},
        charge="v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau",
        updates={"w": "w + (a * (h - v_rest) - w) / tau_w + b * s"},
    )


def test_python_and_toml_agree():
    py, toml = izhikevich_in_python(), load_spec("izhikevich")
    assert py == toml and hash(py) == hash(toml) and py.origin == "<python>"
    lif = NeuronSpec("lif", "Leaky integrate-and-fire (SpikingJelly LIFNode): h = v + (x - (v - v_reset)) / tau",
                     params=[Param("tau", 2.0, doc="membrane time constant, in steps", domain="> 0"),
                             Param("v_threshold", 1), Param("v_reset", 0)],
                     states=[State("v", "v_reset")],
                     charge="v + (x - (v - v_reset)) / tau if decay_input else v - (v - v_reset) / tau + x",
                     options=[("decay_input", True)])
    assert lif == load_spec("lif")
    assert lif != lif.with_defaults(tau=3.0) and lif.with_defaults(tau=3.0).params[0].default == 3.0


def test_spec_is_frozen_hashable_picklable():
    spec = load_spec("izhikevich")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.charge = "v"  # type: ignore[misc]
    assert isinstance(spec.params, tuple) and isinstance(spec.updates, tuple)
    assert {spec: 1}[izhikevich_in_python()] == 1
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec and same(copy.parsed().charge, spec.parsed().charge)
    parsed = pickle.loads(pickle.dumps(spec.parsed()))
    assert parsed.updates == spec.parsed().updates and isinstance(parsed.updates, type(spec.parsed().updates))


def test_param_kinds():
    assert Param("w", 0.0, learnable=True).kind == "tensor"
    assert Param("w", 0.0).kind == "scalar"
    assert Param("w", 1, kind="constant").default == 1.0
    for kind in ("scalar", "constant"):
        with pytest.raises(SpecError, match="learnable"):
            Param("w", 0.0, kind=kind, learnable=True)
    with pytest.raises(SpecError, match="kind"):
        Param("w", 0.0, kind="vector")
    with pytest.raises(SpecError, match="finite"):
        Param("w", float("nan"))


def test_load_by_path(tmp_path):
    path = write(tmp_path, (resource_dir("neuron_specs") / "qif.toml").read_text(), "my_qif.toml")
    assert load_spec(path) == load_spec("qif") == load_spec(str(path))
    assert load_spec(path).origin == str(path)
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(SpecError, match="no shipped spec named 'nope'"):
        load_spec("nope")
    assert load_spec("ParametricLIF").name == "parametric_lif"


def test_the_shipped_specs_are_listed_once_a_process(monkeypatch):
    """A spec loaded by name does not list the package's spec folder again (a glob and a sort per layer built)."""
    from pathlib import Path

    load_spec("lif")

    def refuse(*args, **kwargs):
        raise AssertionError("the shipped specs were listed again")
    monkeypatch.setattr(Path, "glob", refuse)
    assert load_spec("Izhikevich").name == "izhikevich" and load_spec("lif").name == "lif"


def test_new_neuron_in_fifteen_lines_of_toml(tmp_path):
    text = """\
        doc = "Resonate-and-fire: a damped oscillator (v, u) that fires near the peak of v"
        charge = "v + step * (b * v - omega * u + x)"
        [params]
        b = -0.1
        omega = 1.0
        step = 0.1
        v_threshold = 1.0
        v_reset = 0.0
        [states]
        v = 0.0
        u = 0.0
        [updates]
        u = "u + step * (omega * h + b * u)"
        """
    assert len(textwrap.dedent(text).splitlines()) <= 15
    spec = load_spec(write(tmp_path, text, "resonate_and_fire.toml"))
    assert spec.name == "resonate_and_fire" and [st.name for st in spec.states] == ["v", "u"]
    u, omega, step = sympy.symbols("u omega step", real=True)
    parsed = spec.parsed()
    assert same(parsed.charge, v + step * (b * v - omega * u + x))
    assert same(parsed.updates["u"], u + step * (omega * h + b * u))


BASE = """\
name = "n"
charge = "v + x / tau"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
[states]
v = "v_reset"
"""

TOML_ERRORS = [
    ("charge = ", "", None),
    ("chrage = 'v'", "chrage", "chrage"),
    ("[params.tau]\ndefault = 2", "", None),
    ("[surrogate]\nname = 'Nope'", "surrogate.name", "Nope"),
    ("[surrogate]\nname = 'Sigmoid'\nalpha = -1.0", "surrogate.alpha", "alpha"),
    ("[surrogate]\nname = 'Sigmoid'\nbeta = 1.0", "surrogate.beta", "beta"),
    ("[surrogate]\ngradient = 'x.real'", "surrogate.gradient", None),
    ("[options]\nflag = 1", "options.flag", None),
    ("[updates]\nw = 'v'", "updates.w", "w"),
    ("[derived]\nd = 3", "derived.d", None),
    ("reset = 'bogus'", "reset", "bogus"),
    ("threshold = 'x'", "threshold", "x"),
    ("doc = 3", "doc", None),
]


@pytest.mark.parametrize(("extra", "field", "symbol"), TOML_ERRORS)
def test_toml_errors_name_file_field_symbol(tmp_path, extra, field, symbol):
    if extra.startswith("["):
        text = BASE + extra + "\n"
    else:
        text = extra + "\n" + BASE
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.source == str(path) and err.field == field and str(err).startswith(str(path))
    if symbol is not None:
        assert err.symbol == symbol


@pytest.mark.parametrize(("params", "field"), [
    ('tau = "abc"', "params.tau.default"), ("tau = true", "params.tau.default"),
    ("tau = { default = 2.0, knd = 'scalar' }", "params.tau.knd"), ("tau = { kind = 'scalar' }", "params.tau.default"),
    ("tau = { default = 2.0, learnable = 'yes' }", "params.tau.learnable"), ("tau = nan", "params.tau.default"),
])
def test_toml_param_type_errors(tmp_path, params, field):
    text = BASE.replace("tau = 2.0", params)
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert info.value.field == field


def test_a_name_path_or_text_of_the_wrong_type_is_refused_naming_the_function():
    """It failed inside os.fspath, tomllib (bytes: "a bytes-like object is required, not 'str'") or str.replace."""
    from autocuda.spec.load import spec_from_toml
    for bad in (3, None):
        with pytest.raises(TypeError, match="^load_spec: expected a spec's name or a path, got"):
            load_spec(bad)
        with pytest.raises(TypeError, match="^spec_from_toml: expected the TOML text as a str"):
            spec_from_toml(bad)
    with pytest.raises(TypeError, match=r"got bytes \(decode bytes first\)"):
        spec_from_toml(b'name = "x"')


def test_toml_unknown_key_suggests(tmp_path):
    with pytest.raises(SpecError, match="did you mean 'threshold'"):
        load_spec(write(tmp_path, "treshold = 'v_threshold'\n" + BASE))


def test_error_message_format(tmp_path):
    path = write(tmp_path, BASE.replace("v + x / tau", "v + foo"), "lif.toml")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == (f"{path}: field 'charge': unknown name 'foo' "
                               "(known: x, v, tau, v_threshold, v_reset, pi, e)")


def spec(**changes) -> NeuronSpec:
    fields = {"name": "n", "params": {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0},
              "states": {"v": "v_reset"}, "charge": "v + x / tau"}
    return NeuronSpec(**{**fields, **changes})


P = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}
VALIDATION = [
    ({"name": "bad name"}, "name", "bad name"),
    ({"name": 3}, "name", None),
    ({"params": {**P, "lambda": 1.0}}, "params.lambda", "lambda"),
    ({"params": {**P, "exp": 1.0}}, "params.exp", "exp"),
    ({"params": {**P, "v_seq": 1.0}}, "params.v_seq", "v_seq"),
    ({"states": {"v": 0.0, "N": 0.0}, "updates": {"N": "N"}}, "states.N", "N"),
    ({"params": {**P, "ac_v": 1.0}}, "params.ac_v", "ac_v"),
    ({"params": {**P, "_v": 1.0}}, "params._v", "_v"),
    ({"params": {**P, "x": 1.0}}, "params.x", "x"),
    ({"params": {**P, "h": 1.0}}, "params.h", "h"),
    ({"states": {"v": 0.0, "s": 0.0}, "updates": {"s": "s"}}, "states.s", "s"),
    ({"states": {"v": 0.0, "tau": 0.0}, "updates": {"tau": "tau"}}, "states.tau", "tau"),
    ({"derived": {"tau": "1"}}, "derived.tau", "tau"),
    ({"options": {"v": True}}, "options.v", "v"),
    ({"params": {"tau": 2.0, "v_threshold": 1.0}, "states": {"v": 0.0}}, "reset", "v_reset"),
    ({"states": {}}, "states", None),
    ({"states": {"v": "nope"}}, "states.v", "nope"),
    ({"states": {"v": [1]}}, "states.v", None),
    ({"updates": {"v": "v"}}, "updates.v", "v"),
    ({"updates": {"q": "v"}}, "updates.q", "q"),
    ({"states": {"v": 0.0, "w": 0.0}}, "updates.w", "w"),
    ({"charge": "v + h"}, "charge", "h"),
    ({"charge": "v + s"}, "charge", "s"),
    ({"charge": ""}, "charge", None),
    ({"threshold": "v_threshold + x"}, "threshold", "x"),
    ({"threshold": "v_threshold + h"}, "threshold", "h"),
    ({"derived": {"d": "v * 2"}}, "derived.d", "v"),
    ({"derived": {"d": "e2 * 2", "e2": "tau"}}, "derived.d", "e2"),
    ({"derived": {"d": "x"}}, "derived.d", "x"),
    ({"options": {"flag": True}, "charge": "v + flag"}, "charge", "flag"),
    ({"charge": "v + x if nope else v"}, "charge", "nope"),
    ({"options": {"flag": "yes"}}, "options.flag", None),
    ({"reset": "weird"}, "reset", "weird"),
    ({"surrogate": "Nope"}, "surrogate.name", "Nope"),
    ({"surrogate": {"name": "ATan", "alpha": 0}}, "surrogate.alpha", "alpha"),
    ({"params": 3}, "params", None),
    ({"params": {**P, "q": {"default": 1.0, "kind": "scalar", "learnable": True}}}, "params.q.kind", None),
]


@pytest.mark.parametrize(("changes", "field", "symbol"), VALIDATION)
def test_validation_rules(changes, field, symbol):
    with pytest.raises(SpecError) as info:
        spec(**changes)
    assert info.value.field == field and info.value.source == "<python>"
    if symbol is not None:
        assert info.value.symbol == symbol


def test_h_s_hint():
    with pytest.raises(SpecError, match="only in updates"):
        spec(charge="v + h")


def test_valid_variants():
    assert spec(reset="soft", params={"tau": 2.0, "v_threshold": 1.0}, states={"v": 0.0}).reset == "soft"
    assert spec(reset="none", params={"tau": 2.0, "v_threshold": 1.0}, states={"v": 0.0}).reset == "none"
    custom = spec(surrogate={"gradient": "alpha / (1 + abs(x))**2", "alpha": 2.0})
    assert isinstance(custom.surrogate, Custom)
    assert spec(surrogate="ATan").surrogate == ATan()
    derived = spec(derived={"k": "1 / tau", "k2": "k * k"}, charge="v + x * k2").parsed()
    assert same(derived.charge_expanded, v + x / tau**2)
    assert same(derived.derived_values["k2"], 1 / tau**2)
    updates = spec(states={"v": "v_reset", "w": 1.5}, updates={"w": "w + x + h + s + tau"}).parsed()
    assert list(updates.updates) == ["w"] and updates.updates["w"].has(h, s, x)
    with pytest.raises(SpecError, match="unknown option"):
        spec().with_options(nope=True)
    with pytest.raises(SpecError, match="unknown parameter"):
        spec().with_defaults(nope=1.0)


def test_output_is_parsed_checked_and_left_out_of_the_text_of_spiking_specs():
    from autocuda.spec.model import spec_text

    lif = load_spec("lif")
    assert lif.output == "s" and "output" not in spec_text(lif) and lif.parsed().output is None
    membrane = NeuronSpec(name="leaky", charge="v + x", reset="none", threshold="1", states={"v": 0.0},
                          output="v * 2")
    assert "output" in spec_text(membrane) and membrane.parsed().output == 2 * sympy.Symbol("v", real=True)
    with pytest.raises(SpecError, match="output") as error:
        NeuronSpec(name="bad", charge="v + x", reset="none", threshold="1", states={"v": 0.0}, output="h + 1")
    assert error.value.field == "output"
