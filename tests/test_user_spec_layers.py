"""User-written neurons as layers (`autocuda.nn.Neuron` of a TOML spec or an `@autocuda.neuron` step): what the
docs promise a user of docs/spec-format.md and docs/python-neurons.md, where it once went otherwise.

Pinned here: `@autocuda.neuron(initial=...)` names the step's own states and parameters (also where the spec
respells them: a state `h`, the parameter a hard reset reads), and refuses what names no state or is no mapping;
a keyword-only argument of a step is refused (it was baked into the kernel as a constant); a step returning the
wrong number of values is told how many it should return; a layer's output expression reads `v_reset` as 0 under a
soft reset, as the kernels' charge does, on every backend and step mode; a layer given a spec's TOML text
says how to read it. CPU only (the reference, and the host runner where a C++ compiler is present)."""
from __future__ import annotations

import pytest
import torch
from backends import CPU_BACKENDS

import autocuda
from autocuda.base.errors import SpecError
from autocuda.nn import Neuron
from autocuda.spec.load import spec_from_toml
from autocuda.spec.surrogate import Sigmoid

SPIKE = Sigmoid()


def _renamed_step(x, h, w, v_th=1.0, vr=0.25):  # type: ignore[no-untyped-def]
    """A state named `h` (the spec's h_state) and the hard reset's value `vr` (the spec's v_reset)."""
    charge = h + x - 0.1 * w
    s = SPIKE(charge - v_th)
    return s, charge * (1 - s) + vr * s, 0.5 * w + s


def test_python_initial_names_the_steps_own_states_and_parameters() -> None:
    spec = autocuda.neuron(initial={"h": "vr", "w": 0.75})(_renamed_step)
    assert [(s.name, s.init) for s in spec.states] == [("h_state", "v_reset"), ("w", 0.75)]
    layer = Neuron(spec, backend="reference", v_reset=0.5)
    assert (layer.h_state, layer.w) == (0.5, 0.75)
    layer(torch.zeros(3))
    assert torch.equal(layer.h_state, torch.full((3,), 0.5 - 0.075))  # the charge from h = 0.5, w = 0.75


def test_python_initial_refuses_a_name_that_is_no_state() -> None:
    with pytest.raises(SpecError, match="'W' is not a state of the step") as err:
        autocuda.neuron(initial={"W": 1.0})(_renamed_step)
    assert err.value.field == "initial.W"
    with pytest.raises(SpecError, match="initial: expected a mapping") as err:
        autocuda.neuron(initial=[("w", 1.0)])(_renamed_step)
    assert err.value.field == "initial"


def test_python_keyword_only_argument_is_refused_not_baked_in() -> None:
    def step(x, v, *, tau=2.0):  # type: ignore[no-untyped-def]
        h = v + x / tau
        s = SPIKE(h - 1.0)
        return s, h - s

    with pytest.raises(SpecError, match="keyword-only argument 'tau'") as err:
        autocuda.neuron(step)
    assert err.value.field == "params.tau"


def test_python_wrong_number_of_returns_says_how_many() -> None:
    def step(x, v, w, v_th=1.0):  # type: ignore[no-untyped-def]
        h = v + x
        s = SPIKE(h - v_th)
        return s, h - s * v_th

    with pytest.raises(SpecError, match=r"new value of each state \(v, w\).*returned 2 values, not 3"):
        autocuda.neuron(step)

    def swapped(x, v, v_th=1.0):  # type: ignore[no-untyped-def]
        h = v + x
        s = SPIKE(h - v_th)
        return h - s * v_th, s

    with pytest.raises(SpecError, match="its first value is not the spike"):
        autocuda.neuron(swapped)


SOFT_OUTPUT = spec_from_toml('''
name = "soft_output"
charge = "v + x - v_reset"
reset = "soft"
output = "v_reset + s"
[params]
v_threshold = 1.0
v_reset = 0.5
[states]
v = 0.0
''', source="soft_output.toml")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("grad", [False, True])
def test_output_reads_v_reset_as_zero_under_a_soft_reset(backend: str, grad: bool) -> None:
    x = torch.tensor([[0.0, 1.5]], dtype=torch.float64, requires_grad=grad)
    multi = Neuron(SOFT_OUTPUT, backend=backend, step_mode="m")
    single = Neuron(SOFT_OUTPUT, backend=backend, step_mode="s")
    want = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # the charge reads v_reset as 0: h = x
    assert torch.equal(multi(x).detach(), want)
    assert torch.equal(single(x[0]).detach(), want[0])
    assert torch.equal(multi.v, torch.tensor([0.0, 0.5], dtype=torch.float64))


def test_a_layer_given_toml_text_says_how_to_read_it() -> None:
    text = 'name = "a"\ncharge = "v + (x - v) / tau"\n[params]\ntau = 2.0\n'  # a '/': once read as a path
    with pytest.raises(SpecError, match=r"got a spec's TOML text: read it with autocuda.spec_from_toml") as err:
        Neuron(text)
    assert err.value.field == "name" and err.value.source == "<toml text>"


# -- names a layer takes ---------------------------------------------------------------------------------------
def _step_with(parameter: str):  # type: ignore[no-untyped-def]
    namespace = {"SPIKE": SPIKE}
    exec(f"def step(inp, v, {parameter}=2.0):\n"  # noqa: S102 - a step with a chosen parameter name
         f"    charge = v + (inp - v) / {parameter}\n"
         "    s = SPIKE(charge - 1.0)\n"
         "    return s, charge * (1 - s)\n", namespace)
    return namespace["step"]


@pytest.mark.parametrize("parameter", ["grad_a", "h", "x", "v_seq"])
def test_a_parameter_the_spec_would_respell_is_refused_by_name(parameter: str) -> None:
    """A layer takes a step's parameters by their names: `grad_a` became `param0` (and Neuron(spec, grad_a=3.0)
    was refused as unknown), as a traced core's names are respelled; now the step is refused, naming the argument."""
    with pytest.raises(SpecError) as caught:
        autocuda.neuron(_step_with(parameter))
    assert (caught.value.field, caught.value.symbol) == (f"params.{parameter}", parameter)
    assert "rename the argument" in caught.value.message


def test_a_name_that_cannot_name_a_spec_is_refused() -> None:
    """`@autocuda.neuron(name="2x")` made a spec named `python_neuron`, silently."""
    with pytest.raises(SpecError, match="name '2x': a spec name is a letter") as caught:
        autocuda.neuron(name="2x")(_step_with("tau"))
    assert caught.value.field == "name"
    assert autocuda.neuron(name="mine")(_step_with("tau")).name == "mine"


def test_an_unknown_option_is_refused_listing_the_options() -> None:
    with pytest.raises(SpecError, match=r"unknown option 'typo' \(options of 'lif': .*\w"):
        autocuda.load_spec("lif").with_options(typo=True)
