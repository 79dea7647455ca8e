"""The spike's comparison a spec chooses (`fires_at`): ">=" (Θ(0) = 1, the default) or ">" (Θ(0) = 0, NIR's,
snnTorch's and Norse's). Checked where h lands exactly on the threshold (IF with inputs that sum exactly in every
dtype, v_threshold = 1): ">=" fires there, ">" does not, in the spec, its derivation, its printed CUDA, the
reference and the kernels run on the CPU (forward and backward), and the two never share a kernel or a key."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import sympy as sp
import torch
from conftest import compile_launched, compile_together, profile

import autocuda.nn as ann
from autocuda.base.errors import PrintError, SpecError
from autocuda.codegen.dtypes import DTYPES
from autocuda.codegen.kernels import derivation, neuron_kernel
from autocuda.codegen.printer import print_expr
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.derive import THRESHOLD, H, previous_membrane, spike_value
from autocuda.spec.load import load_spec, spec_from_toml
from autocuda.spec.model import Param, spec_text
from autocuda.spec.python import neuron, step_spec
from autocuda.spec.step import StepSpec
from autocuda.spec.surrogate import ATan, Sigmoid
from autocuda.spec.trace import trace
from autocuda.tools.testing.named_launch import backward, forward

IF_TOML = """
name = "if_strict"
charge = "v + x"
fires_at = "{fires_at}"
[params]
v_threshold = 1.0
v_reset = 0.0
[states]
v = "v_reset"
"""
# T = 3, N = 1: h = 1, 0.5, 1 under ">=" (it fires at steps 0 and 2); h = 1, 1.5, 0.5 under ">" (at step 1 only)
X = torch.tensor([[1.0], [0.5], [0.5]])
SPIKES = {">=": [[1.0], [0.0], [1.0]], ">": [[0.0], [1.0], [0.0]]}


def if_spec(fires_at: str = ">"):
    return dataclasses.replace(load_spec("if"), fires_at=fires_at)


# -- the spec ---------------------------------------------------------------------------------------------------
def test_toml_field_and_its_default():
    assert spec_from_toml(IF_TOML.format(fires_at=">")).fires_at == ">"
    assert spec_from_toml(IF_TOML.format(fires_at=">=")).fires_at == ">="
    assert load_spec("if").fires_at == ">="


@pytest.mark.parametrize("value", ['"=>"', '"<"', '"gt"', "1", "true", '[">"]'])
def test_toml_field_refuses_anything_else_by_name(value):
    text = IF_TOML.replace('"{fires_at}"', value)
    with pytest.raises(SpecError) as err:
        spec_from_toml(text, source="strict.toml")
    assert err.value.field == "fires_at" and "fires_at" in str(err.value) and "strict.toml" in str(err.value)


def test_a_misspelt_key_is_refused_with_the_field_it_resembles():
    with pytest.raises(SpecError, match="did you mean 'fires_at'"):
        spec_from_toml(IF_TOML.format(fires_at=">").replace("fires_at", "fire_at"))


def test_python_spec_refuses_an_unknown_comparison():
    with pytest.raises(SpecError) as err:
        if_spec("==")
    assert err.value.field == "fires_at"


def test_keys_differ_and_the_default_keeps_its_text():
    ge, gt = if_spec(">="), if_spec(">")
    assert ge != gt and spec_text(ge) != spec_text(gt)
    assert "fires_at" not in spec_text(ge)  # specs without the field keep their text and cache entries
    assert "fires_at" not in repr(derivation(ge).system)  # and their kernel names
    assert NeuronConfig(ge, ge.surrogate, "hard").key != NeuronConfig(gt, gt.surrogate, "hard").key
    for kind in ("fptt", "bptt", "step-forward", "step-backward"):
        assert neuron_kernel(ge, kind, "float32").kernel_name != neuron_kernel(gt, kind, "float32").kernel_name


# -- derivation and printing ------------------------------------------------------------------------------------
def test_derivation_uses_the_strict_step():
    z = H - THRESHOLD
    assert spike_value(derivation(if_spec(">")).system) == sp.Heaviside(z, 0)
    assert spike_value(derivation(if_spec(">=")).system) == sp.Heaviside(z, 1)
    h = sp.Symbol("h_prev", real=True)
    steps = previous_membrane(derivation(if_spec(">")).system, h).atoms(sp.Heaviside)  # v[t-1] from h[t-1]
    assert steps and all(step.args[1] == 0 for step in steps)


def test_every_level_of_a_multi_level_spike_takes_the_comparison():
    ternary = load_spec("ternary_if")
    system = derivation(dataclasses.replace(ternary, fires_at=">")).system
    steps = spike_value(system).atoms(sp.Heaviside)
    assert len(steps) == len(ternary.levels) and all(step.args[1] == 0 for step in steps)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_printers_spell_the_strict_step_from_the_table(dtype):
    z = sp.Symbol("z", real=True)
    record = DTYPES[dtype]
    assert print_expr(sp.Heaviside(z, 0), dtype, {z: "z"}) == record.op("heaviside_strict", "z")
    assert print_expr(sp.Heaviside(z, 1), dtype, {z: "z"}) == record.op("heaviside", "z")
    with pytest.raises(PrintError, match="H\\(0\\) = 0"):
        print_expr(sp.Heaviside(z, sp.S.Half), dtype, {z: "z"})


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_kernels_compare_strictly_in_every_dtype(dtype):
    compute = DTYPES[dtype].compute
    strict, at_equality = compute.op("heaviside_strict", "(ac_h - ac_thr)"), compute.op("heaviside", "(ac_h - ac_thr)")
    for kind in ("fptt", "step-forward"):
        assert strict in if_spec(">").source(kind, dtype) and strict not in if_spec(">=").source(kind, dtype)
        assert at_equality in if_spec(">=").source(kind, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_native_packed_kernels_compare_with_hgt2(dtype):
    source = if_spec(">").source("fptt", dtype, native=True, lanes=2)
    assert "__hgt2(__hsub2(ac_h, ac_thr)" in source and "__hge2" not in source
    assert "__hge2(__hsub2(ac_h, ac_thr)" in if_spec(">=").source("fptt", dtype, native=True, lanes=2)


# -- running it: the reference and the host runner -------------------------------------------------------------
def _layer_run(spec, backend: str, dtype: torch.dtype, step_mode: str = "m"):
    layer = ann.Neuron(spec, step_mode=step_mode, backend=backend)
    x = X.to(dtype, copy=True).requires_grad_()
    spikes = layer(x) if step_mode == "m" else torch.stack([layer(x_t) for x_t in x])
    (spikes * torch.tensor([[1.0], [2.0], [3.0]], dtype=dtype) + layer.v * 0.5).sum().backward()
    return spikes.detach(), layer.v.detach(), x.grad


@pytest.mark.parametrize("fires_at", [">=", ">"])
def test_reference_fires_only_as_the_comparison_says(fires_at):
    spikes, _, grad = _layer_run(if_spec(fires_at), "torch", torch.float64)
    assert spikes.tolist() == SPIKES[fires_at]
    assert torch.isfinite(grad).all()


# By default ">" in float32 and float16 storage, ">=" (which the golden kernels pin) in float32; with --slow, all.
HOST_CASES = [(fires_at, dtype) for fires_at in (">=", ">")
              for dtype in (torch.float32, torch.float16, torch.float64, torch.bfloat16)
              if profile() == "slow" or dtype == torch.float32 or (fires_at, dtype) == (">", torch.float16)]


@pytest.fixture(scope="module")
def compiled_kernels() -> int:
    """The host kernels of the tests below, compiled up front many to a compiler run (their host calls run with the
    launches recorded: `conftest.compile_launched`); the calls would compile them one a run."""
    runs = {*HOST_CASES, (">=", torch.float32), (">", torch.float32)}
    calls = [functools.partial(_layer_run, if_spec(fires_at), "host", dtype)
             for fires_at, dtype in sorted(runs, key=str)]
    calls.append(functools.partial(_layer_run, if_spec(">"), "host", torch.float32, "s"))
    return compile_launched(*calls, *(functools.partial(test_native_packed_kernels_run_strict, dtype)
                                      for dtype in NATIVE_DTYPES))


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize(("fires_at", "dtype"), HOST_CASES, ids=str)
def test_host_kernels_match_the_reference_on_the_threshold(fires_at, dtype):
    spec = if_spec(fires_at)
    want = _layer_run(spec, "torch", dtype)
    got = _layer_run(spec, "host", dtype)
    assert got[0].tolist() == SPIKES[fires_at]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.usefixtures("compiled_kernels")
def test_single_step_kernels_compare_strictly():
    spec = if_spec(">")
    got, want = _layer_run(spec, "host", torch.float32, "s"), _layer_run(spec, "torch", torch.float32, "s")
    assert got[0].tolist() == SPIKES[">"]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.usefixtures("compiled_kernels")
def test_backward_differs_between_the_comparisons():
    """Where h meets the threshold the spike, so the hard reset's path, differs: so do the input's gradients."""
    ge, gt = _layer_run(if_spec(">="), "host", torch.float32), _layer_run(if_spec(">"), "host", torch.float32)
    assert not torch.equal(ge[2], gt[2])


NATIVE_DTYPES = [torch.float16] + ([torch.bfloat16] if profile() == "slow" else [])


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_native_packed_kernels_run_strict(dtype):
    """The half2 / bfloat162 arithmetic (`native`): two neurons a word; one on the threshold, one above it."""
    spec = if_spec(">")
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x = torch.tensor([[1.0, 1.25], [0.5, 0.0], [0.5, 0.0]], dtype=dtype)
    layout = {"native": True, "lanes": 2}
    out = forward(config, x, {"v": torch.zeros(2, dtype=dtype)}, {"v_threshold": 1.0, "v_reset": 0.0},
                  backend="host", layout=layout)
    assert out["spike_seq"].tolist() == [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    saved = {**out, "x_seq": x, "v_init": torch.zeros(2, dtype=dtype)}
    grads = backward(config, {"grad_spike_seq": torch.ones_like(x), "grad_v_final": torch.zeros(2, dtype=dtype)},
                     saved, {"v_threshold": 1.0, "v_reset": 0.0}, backend="host", layout=layout)
    reference = ann.Neuron(spec, step_mode="m", backend="torch")
    x64 = x.double().requires_grad_()
    spikes = reference(x64)
    spikes.sum().backward()
    assert torch.equal(spikes.to(dtype), out["spike_seq"])
    torch.testing.assert_close(grads["grad_x_seq"].double(), x64.grad, rtol=2e-2, atol=2e-2)


def test_surrogate_call_strict_changes_the_value_at_zero_only():
    z = torch.tensor([-0.5, 0.0, 0.5], requires_grad=True)
    strict = Sigmoid()(z, strict=True)
    strict.sum().backward()
    grad, z.grad = z.grad, None
    Sigmoid()(z).sum().backward()
    assert strict.tolist() == [0.0, 0.0, 1.0] and Sigmoid()(z).tolist() == [0.0, 1.0, 1.0]
    assert torch.equal(grad, z.grad)  # the surrogate gradient is the same


# -- traced Python steps ----------------------------------------------------------------------------------------
def _if_step(spike_function):
    def step(x, v, v_threshold=1.0, v_reset=0.0):
        h = v + x
        s = spike_function(h - v_threshold)
        return s, h * (1 - s) + v_reset * s
    return step


@pytest.mark.parametrize(("strict", "fires_at"), [(False, ">="), (True, ">")])
def test_a_traced_surrogate_keeps_its_comparison(strict, fires_at):
    spec = neuron(_if_step(lambda z: ATan()(z, strict=strict)), name="traced_if")
    assert spec.fires_at == fires_at and spec.reset == "hard" and spec.surrogate == ATan()
    assert _layer_run(spec, "torch", torch.float64)[0].tolist() == SPIKES[fires_at]


def test_the_trace_text_tells_the_comparisons_apart():
    """The trace's text keys the disk cache of traced specs: a strict step must not find a `>=` one's entry."""
    names = ["x", "v", "v_threshold", "v_reset"]
    ge = trace(_if_step(lambda z: ATan()(z)), names)
    gt = trace(_if_step(lambda z: ATan()(z, strict=True)), names)
    assert ge.text() != gt.text() and gt.spike is not None and gt.spike.strict


def test_step_spec_json_keeps_the_comparison():
    step = step_spec(_if_step(lambda z: ATan()(z, strict=True)), ["v"], [Param("v_threshold", 1.0),
                                                                            Param("v_reset", 0.0)])
    assert step.spec.fires_at == ">" and StepSpec.from_json(step.to_json()).spec == step.spec


def test_snntorch_surrogate_is_the_strict_spike():
    """snnTorch's surrogates fire at `input_ > 0`: its ATan is traced as the strict spike with our ATan (the same
    gradient); the kernels then agree with the step run eagerly through snnTorch, values and gradients."""
    surrogate = pytest.importorskip("snntorch.surrogate")
    step = _if_step(lambda z: surrogate.atan()(z))
    spec = neuron(step, name="snn_if")
    assert spec.fires_at == ">" and spec.surrogate == ATan(alpha=2.0)
    x = torch.tensor([[1.0, 0.3], [0.5, 0.9], [0.5, -0.2], [1.0, 0.8]])
    weights = torch.arange(8.0).view(4, 2)
    layer, x_kernel = ann.FlexSN(lambda x, v: step(x, v), 1, backend="host"), x.clone().requires_grad_()
    got = layer(x_kernel)
    (got * weights).sum().backward()
    x_eager, v, spikes = x.clone().requires_grad_(), torch.zeros(2), []
    for x_t in x_eager:
        s, v = step(x_t, v)
        spikes.append(s)
    want = torch.stack(spikes)
    (want * weights).sum().backward()
    assert torch.equal(got, want) and got[0, 0] == 0  # h = 1.0 = v_threshold at t = 0: no spike
    torch.testing.assert_close(x_kernel.grad, x_eager.grad)


def test_a_library_surrogate_parameter_ours_lacks_is_refused_by_name():
    surrogate = pytest.importorskip("snntorch.surrogate")
    with pytest.raises(SpecError, match="'slope'") as err:  # snnTorch's Sigmoid(slope=25): not our Sigmoid(alpha)
        neuron(_if_step(lambda z: surrogate.sigmoid()(z)), name="snn_sigmoid")
    assert "test_fires_at.py" in str(err.value)  # the user's line, not snnTorch's


def test_torch_heaviside_with_zero_at_zero_is_the_strict_step():
    def core(x, v):
        h = v + x
        s = torch.heaviside(h - 1.0, torch.zeros_like(h))
        return s, h * (1 - s)
    want = torch.tensor([[0.0], [1.0], [0.0]])
    assert torch.equal(ann.FlexSN(core, 1, backend="reference")(X), want)
    with pytest.raises(SpecError, match="Θ\\(0\\) other than 0 or 1"):
        ann.FlexSN(lambda x, v: (torch.heaviside(v + x, torch.full_like(x, 0.5)), v + x), 1)


@pytest.mark.skipif(profile() != "slow", reason="nvcc's start-up costs seconds: --slow (the host runner compiles "
                                                  "these sources with the CUDA headers by default, the GPU tests on "
                                                  "the device)")
def test_strict_kernels_are_valid_cuda(nvcc):
    """nvcc (sm_80, sm_90) accepts every strict kernel of every dtype, packed arithmetic and the ternary spike's
    included, in one unit."""
    specs = (if_spec(">"), dataclasses.replace(load_spec("ternary_if"), fires_at=">"))
    kinds = ("fptt", "bptt", "step-forward", "step-backward")
    sources = {f"{s.name} {kind} {dtype}": s.source(kind, dtype) for s in specs for kind in kinds
               for dtype in sorted(DTYPES)}
    sources |= {f"if {kind} {dtype} native": specs[0].source(kind, dtype, native=True, lanes=2)
                for kind in kinds for dtype in ("float16", "bfloat16")}
    assert compile_together(nvcc, sources) == {}
