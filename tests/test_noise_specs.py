"""Random draws in specs (`randn()`, `rand()`; docs/spec-format.md): the syntax and its refusals, and a noisy LIF's
kernels on the host runner against the torch reference fed the same draws (forward, backward with the gradient of
the learnable noise scale, the single step), for any layout."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched, compile_together, first_arch_by_default, profile

from autocuda.base.errors import SpecError
from autocuda.codegen import noise
from autocuda.runtime import reference
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.derive import derive, replaying_charge
from autocuda.spec.draws import system_draws
from autocuda.spec.load import spec_from_toml
from autocuda.spec.system import step_system
from autocuda.toolchain.host import cxx as toolchain
from autocuda.tools.testing.named_launch import backward, forward

NOISY_LIF = """
name = "noisy_lif"
charge = "v + (x - (v - v_reset)) / tau + sigma * randn()"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
sigma = { default = 0.5, learnable = true }
[states]
v = "v_reset"
"""
# two draws in the charge, one in an update: three sites
JITTERY_ALIF = """
name = "jittery_alif"
charge = "v + (x - v) / tau + sigma * (randn() - randn()) / 2"
threshold = "v_threshold + a"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
sigma = 0.3
[states]
v = "v_reset"
a = 0.0
[updates]
a = "0.9 * a + s * (0.1 + 0.05 * rand())"
"""
SCALARS = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, "sigma": 0.5}
F64 = torch.float64


def test_each_call_is_a_site_of_its_own():
    system = step_system(spec_from_toml(JITTERY_ALIF))
    draws = system_draws(system)
    assert [(d.kind, d.site) for d in draws] == [("normal", 0), ("normal", 1), ("uniform", 2)]
    assert not system.charge.has(draws[2].symbol) and system.updates[0].has(draws[2].symbol)


@pytest.mark.parametrize("change, field, words", [
    (("[params]", 'threshold = "1 + randn()"\n[params]'), "threshold", "spike's argument"),
    (("sigma * randn()", "sigma * randn(1)"), "charge", "takes no arguments"),
    (("sigma * randn()", "sigma * randn"), "charge", "without calling it"),
    (("v_reset = 0.0\n", "v_reset = 0.0\nrandn = 1.0\n"), "params", "function or constant"),
])
def test_refusals_name_the_field(change, field, words):
    with pytest.raises(SpecError, match=words) as caught:
        step_system(spec_from_toml(NOISY_LIF.replace(*change)))
    assert field in str(caught.value)


def test_draws_are_refused_outside_the_step_and_in_what_backward_replays():
    from autocuda.spec.surrogate import Custom
    with pytest.raises(SpecError, match="charge and in the updates"):
        Custom("randn() * x")
    ode = NOISY_LIF.replace('charge = "v + (x - (v - v_reset)) / tau + sigma * randn()"\n', "") + \
        '[ode]\nv = "(x - v + sigma * randn()) / tau"\n'
    with pytest.raises(SpecError, match="stochastic integrator"):
        step_system(spec_from_toml(ode))
    with pytest.raises(ValueError, match="replay its charge"):
        replaying_charge(derive(step_system(spec_from_toml(NOISY_LIF))))
    config = NeuronConfig(spec_from_toml(NOISY_LIF), spec_from_toml(NOISY_LIF).surrogate, "hard")
    x = torch.zeros(2, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="native"):
        forward(config, x, {"v": torch.zeros(4, dtype=x.dtype)}, {**SCALARS, **noise.Seed(1).arguments()},
                backend="host", layout={"native": True, "lanes": 2})


@pytest.fixture(scope="module", autouse=True)
def host_kernels() -> int:
    """The host kernels of the tests' host runs (their calls, run with the launches recorded), compiled up front
    many to a compiler run (`conftest.compile_launched`): the calls would compile them one a run."""
    if toolchain.missing() is not None:
        return 0
    calls = [functools.partial(test_host_forward_equals_reference, F64),
             test_backward_gives_the_noise_scale_its_gradient,
             test_same_seed_same_draws_for_any_layout_and_the_single_step, test_an_explicit_generator_seeds_the_calls,
             *(functools.partial(test_layers_take_their_seed_from_torch, mode) for mode in ("m", "s"))]
    return compile_launched(*calls)


def run_reference(spec, x, v0, seed, sigma):
    system = step_system(spec)
    params = {p: (sigma if p.name == "sigma" else SCALARS[p.name]) for p in system.params}
    return reference.multi_step(system, x, [v0], params, spec.surrogate, seed=seed)


def inputs(dtype, steps=7, neurons=37):
    generator = torch.Generator().manual_seed(0)
    return torch.rand(steps, neurons, generator=generator, dtype=dtype), torch.zeros(neurons, dtype=dtype)


@pytest.mark.parametrize("dtype", [F64] + ([torch.float32] if profile() == "slow" else []), ids=str)
def test_host_forward_equals_reference(dtype):
    """(float32 by default in the layouts' test below, against itself; here under --slow)"""
    spec = spec_from_toml(NOISY_LIF)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x, v0 = inputs(dtype)
    seed = noise.Seed(2**64 - 3, offset=5)
    out = forward(config, x, {"v": v0}, {**SCALARS, **seed.arguments()}, backend="host")
    spikes, (v_final,), _ = run_reference(spec, x, v0, seed, 0.5)
    assert torch.equal(out["spike_seq"], spikes)
    torch.testing.assert_close(out["v_final"], v_final, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-13)
    # the noise is there: without it the membranes differ
    quiet = forward(config, x, {"v": v0}, {**SCALARS, "sigma": 0.0, **seed.arguments()}, backend="host")
    assert (quiet["h_seq"] - out["h_seq"]).abs().max() > 0.1


@pytest.mark.parametrize("dtype, offset, steps, tolerance", [(F64, 0, 7, 1e-10), (torch.float32, 3, 10, 1e-5)],
                         ids=["float64", "float32"])
def test_backward_gives_the_noise_scale_its_gradient(dtype, offset, steps, tolerance):
    """BPTT makes the forward's draws again, in its reverse loop (groups of 2 steps in float64, 4 in float; here
    from mid-group): d loss / d x and d loss / d sigma (the sum of g_h times each draw) equal autograd's through the
    reference fed the same draws."""
    spec = spec_from_toml(NOISY_LIF)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x, v0 = inputs(dtype, steps=steps)
    seed = noise.Seed(99, offset=offset)
    out = forward(config, x, {"v": v0}, {**SCALARS, **seed.arguments()}, backend="host")
    generator = torch.Generator().manual_seed(1)
    grad_spike = torch.randn(x.shape, generator=generator, dtype=dtype)
    grad_v = torch.randn(x.shape[1], generator=generator, dtype=dtype)
    grads = backward(config, {"grad_spike_seq": grad_spike, "grad_v_final": grad_v},
                     {"h_seq": out["h_seq"], "x_seq": x, "v_init": v0}, {**SCALARS, **seed.arguments()},
                     backend="host")
    x_ref, sigma = x.clone().requires_grad_(), torch.tensor(0.5, dtype=dtype, requires_grad=True)
    spikes, (v_final,), _ = run_reference(spec, x_ref, v0, seed, sigma)
    ((spikes * grad_spike).sum() + (v_final * grad_v).sum()).backward()
    torch.testing.assert_close(grads["grad_x_seq"], x_ref.grad, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(grads["grad_sigma"].sum(), sigma.grad, rtol=tolerance, atol=tolerance)
    assert sigma.grad.abs() > 0.1


def test_same_seed_same_draws_for_any_layout_and_the_single_step():
    """A draw is a function of (seed, neuron, offset + t, site) alone: two layouts give the same bits, a different
    seed other draws, and single steps at offsets 5, 6, ... the multi-step call's steps."""
    spec = spec_from_toml(JITTERY_ALIF)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x, v0 = inputs(torch.float32, steps=4, neurons=41)
    init = {"v": v0, "a": torch.zeros_like(v0)}
    seed = noise.Seed(7, offset=5)
    scalars = {k: v for k, v in SCALARS.items() if k != "sigma"} | {"sigma": 0.3}
    plain = forward(config, x, init, {**scalars, **seed.arguments()}, backend="host", store_state_seq=True)
    wide = forward(config, x, init, {**scalars, **seed.arguments()}, backend="host", store_state_seq=True,
                   layout={"lanes": 4, "block": 64})
    assert all(torch.equal(plain[k], wide[k]) for k in plain)
    other = forward(config, x, init, {**scalars, **noise.Seed(8, offset=5).arguments()}, backend="host",
                    store_state_seq=True)
    assert not torch.equal(other["h_seq"], plain["h_seq"])
    states = init
    for t in range(x.shape[0]):
        step = forward(config, x[t], states, {**scalars, **noise.Seed(7, offset=5 + t).arguments()},
                       single_step=True, backend="host")
        assert torch.equal(step["h_seq"], plain["h_seq"][t])
        states = {"v": step["v_final"], "a": step["a_final"]}


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_layers_take_their_seed_from_torch(step_mode):
    """nn.Neuron seeds each call from torch's generator: torch.manual_seed repeats a call, the next call draws
    anew; the host kernels and the torch reference draw alike, and backward (the kernels' making the forward's
    draws again) gives x and the learnable noise scale the reference's gradients."""
    from autocuda import nn as ann

    spec = spec_from_toml(NOISY_LIF)
    x = torch.rand(4, 3, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    results = {}
    for backend in ("host", "reference"):
        layer = ann.Neuron(spec, step_mode=step_mode, backend=backend).double()
        given = x.clone().requires_grad_()
        torch.manual_seed(11)
        out = layer(given) if step_mode == "m" else torch.stack([layer(step) for step in given])
        out.sum().backward()
        layer.reset()
        torch.manual_seed(11)
        again = layer(x) if step_mode == "m" else torch.stack([layer(step) for step in x])
        layer.reset()
        later = layer(x) if step_mode == "m" else torch.stack([layer(step) for step in x])
        layer.reset()
        assert torch.equal(out, again) and not torch.equal(out, later)
        results[backend] = (out.detach(), given.grad, layer.sigma.grad)
    (out, grad_x, grad_sigma), (out_ref, grad_x_ref, grad_sigma_ref) = results["host"], results["reference"]
    assert torch.equal(out, out_ref)
    torch.testing.assert_close(grad_x, grad_x_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_sigma, grad_sigma_ref, rtol=1e-10, atol=1e-12)


def test_kernels_that_draw_compile_for_the_gpu(nvcc):
    """nvcc accepts a drawing spec's kernels (normal and uniform draws; the generator in float and in double,
    forward and backward) in one unit: the generator's definitions sit behind include guards. (Every dtype and
    kernel kind: tests/gpu/test_noise_gpu.py.)"""
    spec = spec_from_toml(JITTERY_ALIF)
    sources = {"fptt float32": spec.source("fptt", "float32"), "bptt float64": spec.source("bptt", "float64")}
    assert compile_together(nvcc, sources, archs=first_arch_by_default()) == {}


def test_python_steps_trace_randn_like_into_a_draw():
    """torch.randn_like of a step value is the spec's randn(): a traced noisy LIF runs on the host kernels as the
    reference does, seeded alike; a draw's value used in two equations, and randn_like of a real tensor, are
    refused at their line."""
    from autocuda import nn as ann
    from autocuda.spec.model import Param
    from autocuda.spec.python import step_spec
    from autocuda.spec.surrogate import Sigmoid

    def noisy(x, v, tau, sigma):
        h = v + (x - v) / tau + sigma * torch.randn_like(v)
        s = Sigmoid()(h - 1.0)
        return s, h * (1 - s)

    params = [Param("tau", 2.0), Param("sigma", 0.5, learnable=True)]
    spec = step_spec(noisy, ["v"], params).spec
    assert "randn()" in spec.charge and [d.kind for d in system_draws(step_system(spec))] == ["normal"]
    x = torch.rand(5, 6, generator=torch.Generator().manual_seed(3), dtype=F64)
    outputs = []
    for backend in ("host", "reference"):
        torch.manual_seed(4)
        outputs.append(ann.Neuron(spec, step_mode="m", backend=backend).double()(x))
    assert torch.equal(*outputs)

    def reused(x, v, w, tau, sigma):
        n = torch.rand_like(v)
        h = v + (x - v) / tau + sigma * n
        s = Sigmoid()(h - 1.0)
        return s, h * (1 - s), 0.5 * w + n

    with pytest.raises(SpecError, match=r"torch.rand_like\(...\) call is used in 2 places"):
        step_spec(reused, ["v", "w"], params)

    def outside(x, v, tau, sigma):
        h = v + (x - v) / tau + sigma * float(torch.randn_like(torch.zeros(())))
        s = Sigmoid()(h - 1.0)
        return s, h * (1 - s)

    with pytest.raises(SpecError, match="torch.randn_like of a tensor that is not a step value"):
        step_spec(outside, ["v"], params)


def test_an_explicit_generator_seeds_the_calls():
    """Within `noise.using_generator(g)`, calls take their seeds from g and leave torch's default generator as it
    was; g seeded alike repeats the call."""
    from autocuda.call import functional as F

    spec = spec_from_toml(NOISY_LIF)
    x = torch.rand(3, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    state = torch.random.get_rng_state()
    runs = []
    for _ in range(2):
        with noise.using_generator(torch.Generator().manual_seed(123)):
            runs.append(F.multi_step(spec, x, backend="host", store_state_seq=True)[2][0])
    assert torch.equal(torch.random.get_rng_state(), state) and torch.equal(*runs)
    with pytest.raises(TypeError, match="CPU torch.Generator"):
        with noise.using_generator(123):  # type: ignore[arg-type]
            pass


def test_check_spec_runs_a_spec_that_draws():
    """`autocuda check` (check_spec) seeds the kernels and the reference alike (testing.cases.CHECK_SEED): a
    drawing spec's FPTT, BPTT and single-step kernels pass against the reference fed the same draws."""
    from autocuda.tools.testing import check_spec

    report = check_spec(spec_from_toml(NOISY_LIF), dtypes=("float32",), resets=("hard",), detach=(False,),
                        examples=1)
    assert report.passed and report.cases, report.summary()


def test_makes_draws_reads_the_calls_from_the_text():
    """The configuration's seed arguments are decided from the text (no sympy; string methods alone): a call of
    randn or rand, not a name that holds the word."""
    from autocuda.spec.draws import makes_draws
    from autocuda.spec.load import load_spec

    assert makes_draws(spec_from_toml(NOISY_LIF)) and makes_draws(spec_from_toml(JITTERY_ALIF))
    assert not makes_draws(load_spec("lif"))
    lookalike = NOISY_LIF.replace("sigma * randn()", "grandn * (x - my_rand)").replace(
        "sigma = { default = 0.5, learnable = true }", "grandn = 0.5\nmy_rand = 0.1")
    assert not makes_draws(spec_from_toml(lookalike))


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_a_layer_that_draws_runs_eagerly_under_torch_compile(step_mode: str) -> None:
    """torch.compile of a drawing layer (aot_eager: Dynamo and AOT, no Inductor) gives the eager layer's results
    call by call from one torch.manual_seed (a fresh seed per call, not one traced constant), and so does a
    compiled functional call; before the graph break it crashed the process in the host launch."""
    from autocuda.call import functional as F
    from autocuda.nn import Neuron

    spec = spec_from_toml(NOISY_LIF)
    x = torch.rand(4, 32) * 0.9 if step_mode == "m" else torch.rand(32) * 0.9

    def calls(layer: torch.nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(3)
        outputs = []
        for _ in range(3):
            layer.reset()
            outputs.append(layer(x))
        return outputs

    eager = calls(Neuron(spec, backend="host", step_mode=step_mode))
    compiled = calls(torch.compile(Neuron(spec, backend="host", step_mode=step_mode), backend="aot_eager"))
    assert not torch.equal(eager[0], eager[1])
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    if step_mode == "m":
        run = torch.compile(lambda x_seq: F.multi_step(spec, x_seq, backend="host")[0], backend="aot_eager")
        torch.manual_seed(5)
        first = run(x)
        torch.manual_seed(5)
        assert torch.equal(first, F.multi_step(spec, x, backend="host")[0])
