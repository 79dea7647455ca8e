"""The runtime on a GPU, through the public API (autocuda.functional / autocuda.nn -> autocuda::neuron_* ops ->
generated kernels on torch's current stream):

- property tests (hypothesis) for every shipped spec: random shapes (odd N, T = 1), random parameters, hard and
  soft reset, detach_reset on and off, all four dtypes; spikes, states and gradients against a float64 reference
  computed from the same (rounded) inputs;
- vectorised layouts (large N) against the reference;
- torch.compile(fullgraph=True) of Linear -> LIFNode -> Linear -> IzhikevichNode against eager, forward and backward;
- opcheck for every op form; a side stream and a CUDA graph replay against the default stream;
- a second process with a warm disk cache compiles nothing and imports no sympy (and neither process CuPy);
- a kernel loaded on one thread launches from another (each launch runs in the device's context);
- long loops take the layout timed fastest, stored on disk, with the fixed rule's results.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sympy.core.relational import Relational
from torch import nn

from autocuda import nn as ann
from autocuda.call import functional as F
from autocuda.call import ops
from autocuda.runtime import reference
from autocuda.runtime.configs import get_config, resolve_spec
from autocuda.spec.domain import problem as domain_problem
from autocuda.spec.draws import makes_draws
from autocuda.spec.load import list_specs, load_spec
from autocuda.spec.model import reset_rules
from autocuda.spec.torch_eval import evaluate

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F64 = torch.float64
# specs that draw (noisy_cuba_lif) are checked against the reference fed the same draws in tests/gpu/test_noise_gpu.py
SPECS = [name for name, _ in list_specs() if not makes_draws(load_spec(name))]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# (rtol, atol as a fraction of the tensor's largest magnitude, ambiguity margin of |h - threshold|).
# float64: kernel (CSE'd derived adjoint) and reference (autograd) differ in operation order only.
# float32: fp32 arithmetic from identical inputs: ~6e-8 per operation, over up to 8 steps of quadratic or
#   exponential dynamics whose Jacobians may exceed 1.
# float16 / bfloat16: arithmetic is fp32, but h, states and gradients are *stored* with 11 / 8 significant bits
#   (unit roundoff 4.9e-4 / 3.9e-3). Backward recomputes the spike, the surrogate and v[t-1] from the stored h,
#   and sigma' (Sigmoid, alpha=4) amplifies an error in h by up to 4, summed over T steps: hence ~20x / ~10x the
#   unit roundoff relative to the largest gradient; the margins are ~4 units of storage rounding of h.
# float32 on the GPU: 2-ulp transcendentals and divisions (--prec-div=false) give
# 1e-5-sized errors that cancellation can raise. An sfa_lif initial-state gradient 4.6e-5 off (float32, one step,
# one neuron, seed 7; identical with IEEE division) was not that rounding but the exact integrator's coupling
# phi = (e^{a dt} - e^{d dt})/(a - d) cancelling where tau and tau_w nearly coincide (RANGES draws both from
# (1.5, 4.0)): on the host runner that form put the gradient reaching w 8.1e-5 off at tau = 3.919527,
# tau_w = 3.918607. phi is computed with expm1 since (docs/ode.md, Rounding; tests/test_ode.py).
TOLERANCES = {F64: (1e-12, 1e-12, 1e-12), torch.float32: (5e-5, 5e-5, 1e-5),
              torch.float16: (1e-2, 1e-2, 2e-3), torch.bfloat16: (4e-2, 4e-2, 1.6e-2)}
# Random parameter ranges (the spec default is used for any other parameter).
RANGES = {"tau": (1.5, 4.0), "tau_w": (1.5, 4.0), "tau_a": (2.0, 30.0), "v_threshold": (0.6, 1.4),
          "v_reset": (-0.3, 0.2), "v_rest": (-0.2, 0.1), "v_c": (0.5, 1.0), "a0": (0.5, 1.0), "delta_T": (0.5, 1.5),
          "theta_rh": (0.5, 1.0), "a": (0.0, 0.5), "b": (0.0, 0.5), "beta": (0.0, 0.5), "R": (0.5, 1.5)}
BOUND = 20.0  # inputs are halved until every reference state stays within this (quadratic models can diverge)
KERNELS = None  # the backend of the kernel runs: None picks the CUDA kernels for CUDA tensors
EXAMPLES = int(os.environ.get("AUTOCUDA_GPU_EXAMPLES", "30"))  # hypothesis examples per spec


def uniform(g: torch.Generator, shape, low: float, high: float) -> torch.Tensor:
    return torch.rand(shape, generator=g, dtype=F64) * (high - low) + low


def rounded(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return value.to(dtype).to(F64)


def random_params(name: str, g: torch.Generator, compute: torch.dtype, shape) -> dict:
    """Floats rounded to the arithmetic dtype (the kernels take scalars in it); PLIF's w per neuron."""
    params = {}
    for p in resolve_spec(name).params:
        if p.learnable:
            params[p.name] = rounded(uniform(g, shape, -1.0, 1.0), compute)
        elif p.name in RANGES:  # drawn from the range where it lies inside the spec's domain (raf: b < 0)
            value = float(rounded(uniform(g, (), *RANGES[p.name]), compute))
            inside = domain_problem(p.bounds, value) is None
            params[p.name] = value if inside else float(rounded(torch.tensor(p.default), compute))
        else:  # parameters without a random range (e.g. an ODE spec's time_step) keep their defaults
            params[p.name] = float(rounded(torch.tensor(p.default), compute))
    return params


def _distance(system, values: dict, h: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """How far a step's spike is from changing: |h - threshold|; with spike levels (stbif's +1 at h >= 1 while
    acc_q < pos_max, -1 at h < 0 while acc_q > neg_min), the nearest of each level's argument and each comparison
    in it; and the nearest of each comparison in the charge (klif's rectifier, where(0 < z, z, 0)). Backward reads
    the states as stored, rounded to the dtype, so a comparison of a state within rounding of its bound takes the
    other branch there (an acc_q of 0.9991 stored as 1.0 in bfloat16; klif, bfloat16, seed 68991: grad x -0.23
    where the reference's is 0, at a neuron whose z lies within bfloat16's rounding of 0)."""
    charge = [c.lhs - c.rhs for c in system.charge.atoms(Relational)]
    if not system.levels and not charge:
        return (h - threshold).abs()
    at = {**values, reference.H: h, reference.THRESHOLD: threshold}
    spike = [term for level in system.levels for term in (level.argument, *(c.lhs - c.rhs for c in
                                                                          level.argument.atoms(Relational)))]
    terms = [*(spike or [reference.H - reference.THRESHOLD]), *charge]
    distances = [torch.as_tensor(evaluate(term, at), dtype=h.dtype, device=h.device).abs() for term in terms]
    return torch.stack([torch.broadcast_to(d, h.shape) for d in distances]).amin(0)


def reference_run(name, xs, states, params, reset, detach, grads):
    """float64 reference over the step inputs `xs` (one sequence per input of the spec): outputs, gradients
    (of each input first), and h - threshold per step (for the ambiguity mask)."""
    xs = [x.clone().requires_grad_() for x in xs]
    states = [s.clone().requires_grad_() for s in states]
    params = {k: (v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    spikes, finals, seqs = F.multi_step(name, tuple(xs), *states, reset=reset, detach_reset=detach,
                                        store_state_seq=True, backend="reference", **params)
    outputs = [spikes, *finals, *seqs]
    leaves = [*xs, *states, *(v for v in params.values() if isinstance(v, torch.Tensor))]
    # a state nothing reads (liaf's and clif's v_charged, a record of h) has a zero gradient for its initial value
    gradients = torch.autograd.grad(sum((o * g).sum() for o, g in zip(outputs, grads)), leaves, allow_unused=True,
                                    materialize_grads=True)
    config = get_config(resolve_spec(name), None, reset, detach, (), (), False)
    system, symbols = config.reference_step
    values = {symbols[k]: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    margins, before = [], [s.detach() for s in states]
    for t in range(xs[0].shape[0]):
        step_inputs = tuple(x[t].detach() for x in xs)
        step_values = {**values, **dict(zip(system.inputs, step_inputs)),
                       **dict(zip(system.states, before))}
        threshold = evaluate(system.threshold, step_values)
        h = reference.step(system, step_inputs, before, values, config.surrogate, detach)[2]
        margins.append((_distance(system, step_values, h, threshold), h.abs() + threshold.abs()))
        before = [s[t].detach() for s in seqs]
    return [o.detach() for o in outputs], list(gradients), margins


def kernel_run(name, xs, states, params, reset, detach, grads, dtype):
    xs = [x.to(dtype).clone().requires_grad_() for x in xs]
    states = [s.to(dtype).clone().requires_grad_() for s in states]
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    params = {k: (v.to(compute).clone().requires_grad_() if isinstance(v, torch.Tensor) else v)
              for k, v in params.items()}
    spikes, finals, seqs = F.multi_step(name, tuple(xs), *states, reset=reset, detach_reset=detach,
                                        store_state_seq=True, backend=KERNELS, **params)
    outputs = [spikes, *finals, *seqs]
    assert all(o.dtype == dtype and o.device == xs[0].device for o in outputs)
    leaves = [*xs, *states, *(v for v in params.values() if isinstance(v, torch.Tensor))]
    loss = sum((o.to(F64) * g).sum() for o, g in zip(outputs, grads))
    return [o.detach() for o in outputs], list(torch.autograd.grad(loss, leaves))


def assert_close(what: str, actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor, rtol, atol,
                 scale: float | None = None) -> None:
    """|actual - expected| <= rtol |expected| + atol * scale, scale defaulting to the largest |expected|."""
    actual, expected = actual.to(F64)[mask], expected[mask]
    if expected.numel() == 0:
        return
    scale = float(expected.abs().max()) if scale is None else scale
    excess = (actual - expected).abs() - rtol * expected.abs() - atol * scale
    worst = int(excess.argmax())
    assert excess.max() <= 0, (f"{what}: {actual[worst].item()!r} vs reference {expected[worst].item()!r} "
                               f"(rtol {rtol}, atol {atol} x max {expected.abs().max().item():.3g})")


def check_case(name: str, dtype: torch.dtype, reset: str, detach: bool, steps: int, shape: tuple, seed: int):
    g = torch.Generator().manual_seed(seed)
    compute = torch.float32 if dtype != F64 else F64
    spec = resolve_spec(name)
    params = random_params(name, g, compute, shape)
    states = [rounded(uniform(g, shape, -0.2, 0.4), dtype).to(CUDA) for _ in spec.states]
    params = {k: (v.to(CUDA) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    xs = [uniform(g, (steps, *shape), -0.5, 1.5) for _ in spec.inputs]  # one sequence per step input
    for _ in range(8):  # scale inputs down until the dynamics stay bounded
        xs = [rounded(x, dtype).to(CUDA) for x in xs]
        seqs = F.multi_step(name, tuple(xs), *states, reset=reset, store_state_seq=True, backend="reference",
                            **params)[2]
        if all(torch.isfinite(s).all() and s.abs().max() <= BOUND for s in seqs):
            break
        xs = [x / 2 for x in xs]
    grads = [rounded(uniform(g, (steps, *shape) if i == 0 or i > len(spec.states) else shape, -1, 1), dtype).to(CUDA)
             for i in range(1 + 2 * len(spec.states))]
    want, want_grads, margins = reference_run(name, xs, states, params, reset, detach, grads)
    got, got_grads = kernel_run(name, xs, states, params, reset, detach, grads, dtype)
    rtol, atol, margin = TOLERANCES[dtype]
    ambiguous = torch.stack([d <= margin * s for d, s in margins]).expand(steps, *shape)
    valid = ambiguous.cumsum(0) == 0            # steps before a neuron's first ambiguous step
    clean = valid[-1]                           # neurons never ambiguous: final states and every gradient
    n_states = len(spec.states)
    assert torch.equal(got[0][valid].to(F64), want[0][valid]), f"{name} spikes differ away from the threshold"
    # A state's rounding error scales with the values entering the step, not with the state itself, which can be
    # a near-cancellation (two_compartment in float32, one neuron: v = -2.9e-4 out of terms near 1).
    values = [*xs, *states, *want[1:]]
    state_scale = max(float(v.to(F64).abs().max()) for v in values)
    for i in range(n_states):
        assert_close(f"{name} final {spec.states[i].name}", got[1 + i], want[1 + i], clean, rtol, atol, state_scale)
        assert_close(f"{name} {spec.states[i].name}_seq", got[1 + n_states + i], want[1 + n_states + i], valid,
                     rtol, atol, state_scale)
    # Gradients are sums of products of upstream gradients and Jacobians computed from stored (rounded) values:
    # their error scales with the largest gradient of the step, not with each tensor's own size, which can be
    # a near-cancellation (one neuron, w_init of FitzHugh-Nagumo in float16: 1e-5 out of terms near 1).
    # In half precision the stored h is off by up to 2e-3 of itself, which moves every term of a gradient: the
    # scale is then that of the gradients with the upstream gradients' signs dropped, which do not cancel
    # (EIF, bfloat16, one neuron and step, seed 17: grad x 0.0024 = (-0.529 + 0.535) / tau; the kernel's 0.0012
    # is the reference at the stored h).
    n_inputs = len(xs)
    masks = [clean.expand(steps, *shape)] * n_inputs + [clean] * (len(want_grads) - n_inputs)
    scale = max((float(w[m].abs().max()) for w, m in zip(want_grads, masks) if m.any()), default=0.0)
    if dtype in (torch.float16, torch.bfloat16):
        terms = reference_run(name, xs, states, params, reset, detach, [g.abs() for g in grads])[1]
        scale = max([scale] + [float(w[m].abs().max()) for w, m in zip(terms, masks) if m.any()])
    for i, (a, b) in enumerate(zip(got_grads[:n_inputs], want_grads)):
        assert_close(f"{name} grad {spec.inputs[i]}", a, b, masks[i], rtol, atol, scale)
    for i, (a, b) in enumerate(zip(got_grads[n_inputs:], want_grads[n_inputs:])):
        assert_close(f"{name} grad of leaf {i + 1}", a, b, clean, rtol, atol, scale)
    return float(clean.double().mean())


NEURON_SHAPES = st.one_of(st.tuples(st.integers(1, 70)), st.tuples(st.integers(1, 4), st.integers(1, 33)))


@pytest.mark.parametrize("name", SPECS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(DTYPES), reset=st.sampled_from(["hard", "soft"]), detach=st.booleans(),
       steps=st.integers(1, 8), shape=NEURON_SHAPES, seed=st.integers(0, 2**31 - 1))
def test_kernels_match_reference(name, dtype, reset, detach, steps, shape, seed):
    rules = reset_rules(load_spec(name))  # a spec without v_reset has no hard reset: its own rule instead
    check_case(name, dtype, reset if reset in rules else rules[0], detach, steps, shape, seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["lif", "izhikevich", "parametric_lif"])
def test_vectorised_layouts_match_reference(name, dtype):
    # N large enough for the launch layer to pick several neurons per thread with wide aligned accesses
    clean = check_case(name, dtype, "hard", False, 3, (2, 2**18), seed=7)
    assert clean > 0.8  # neurons whose h came within the margin of the threshold are not compared


@pytest.mark.parametrize("shape", [(4, 4097), (8, 2**18), (64, 2**12)], ids=["odd", "wide", "long"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["lif", "izhikevich"])
def test_final_states_false_gives_the_same_spikes_and_gradients(name, dtype, shape):
    """Without final states (every layout: odd N, vector accesses, tuned long loops) the spikes, stored state
    sequences and input gradients are bitwise those of the call that writes them."""
    g = torch.Generator(device=CUDA).manual_seed(11)
    x = (torch.randn(shape, device=CUDA, generator=g) * 2 + 0.5).to(dtype)
    upstream = torch.randn(shape, device=CUDA, generator=g).to(dtype)
    runs = []
    for final_states in (True, False):
        xg = x.clone().requires_grad_(True)
        spikes, finals, seqs = F.multi_step(name, xg, store_state_seq=True, final_states=final_states)
        (grad,) = torch.autograd.grad(spikes, xg, upstream)
        with torch.no_grad():
            inferred, _, _ = F.multi_step(name, x, final_states=final_states)
        assert (finals is None) is not final_states
        runs.append((spikes, *seqs, grad, inferred))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# -- torch.compile, opcheck, streams, CUDA graphs -------------------------------------------------------------
class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.lif = nn.Linear(16, 32), ann.LIFNode(step_mode="m")
        self.fc2, self.izh = nn.Linear(32, 8), ann.IzhikevichNode(step_mode="m", a=0.1, b=0.2)
        for fc in (self.fc1, self.fc2):  # enough drive for both layers to fire
            nn.init.uniform_(fc.weight, -0.1, 0.3)

    def forward(self, x):
        return self.izh(self.fc2(self.lif(self.fc1(x))))

    def run(self, model, x):
        """Two calls (the second from the first's states) and a backward: outputs and parameter gradients."""
        self.lif.reset(), self.izh.reset()
        self.zero_grad(set_to_none=True)
        first, second = model(x), model(x)
        (first.sum() + 2 * second.sum() + self.izh.w.sum()).backward()
        # detached copies: nothing may keep this autograd graph alive (a CUDA graph capture would find the
        # parameters' gradient accumulators of an older graph, bound to another stream)
        return [t.detach().clone() for t in (first, second, *(p.grad for p in self.parameters()))]


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    net = TwoLayer().to(CUDA)
    x = torch.rand(8, 4, 16, device=CUDA) * 2
    eager = net.run(net, x)
    torch._dynamo.reset()
    compiled = net.run(torch.compile(net, fullgraph=True), x)
    assert eager[0].sum() > 0 and eager[1].sum() > 0
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _op_args(name: str, dtype: torch.dtype, single: bool, store: bool, numbers: bool = False, finals: bool = True):
    spec = resolve_spec(name)
    signature = (("w", True, True),) if name == "parametric_lif" else ()
    plan = get_config(spec, None, None, False, (), signature, True)
    compute = torch.float32 if dtype != F64 else F64
    x = (torch.rand((37,) if single else (5, 37), device=CUDA) * 2).to(dtype).requires_grad_()
    states = [] if numbers else [torch.zeros(37, device=CUDA, dtype=dtype, requires_grad=True)
                                 for _ in plan.state_names]
    initial = [0.25 * i for i in range(len(plan.state_names))] if numbers else []
    tensors = [torch.full((37,), 0.3, device=CUDA, dtype=compute, requires_grad=True) for _ in plan.tensors]
    scalars = [float(dict((p.name, p.default) for p in spec.params)[n]) for n in plan.op_scalars]
    return plan.key, x, states, initial, tensors, scalars, store, True, finals, []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["lif", "parametric_lif", "izhikevich", "alif"])
@pytest.mark.parametrize(("single", "store", "with_finals"),
                         [(False, False, True), (False, True, True), (False, False, False), (True, False, True)],
                         ids=["multi", "multi-store", "multi-no-finals", "single"])
@pytest.mark.parametrize("numbers", [False, True], ids=["tensor-states", "number-states"])
def test_opcheck(name, dtype, single, store, with_finals, numbers):
    args = _op_args(name, dtype, single, store, numbers, with_finals)
    torch.library.opcheck(torch.ops.autocuda.neuron_forward.default, args)
    key, x, states, initial, tensors, scalars, *_ = args
    detached = [x.detach(), [s.detach() for s in states], [t.detach() for t in tensors]]
    outputs = torch.ops.autocuda.neuron_forward(key, detached[0], detached[1], initial, detached[2], scalars, store,
                                                True, with_finals, [])
    available = {"x_seq": detached[0], **{f"{s}_init": v for s, v in zip(ops.entry(key).state_names, detached[1])},
                 **dict(zip(ops.forward_outputs(key, single, store, True, with_finals), outputs))}
    saved = [available[n] for n in ops.saved_names(key, single, not numbers)]
    n = x.shape[-1]
    finals = [torch.ones(n, device=CUDA, dtype=dtype) for _ in ops.entry(key).state_names] if with_finals else []
    seqs = [torch.ones_like(x) for _ in ops.entry(key).state_names] if store else []
    torch.library.opcheck(torch.ops.autocuda.neuron_backward.default,
                          (key, torch.ones_like(detached[0]), finals, seqs, saved, initial, detached[2], scalars))


def test_side_stream_and_cuda_graph_match_default_stream():
    torch.manual_seed(1)
    net = TwoLayer().to(CUDA)
    a, b = torch.randn(2048, 2048, device=CUDA), torch.randn(2048, 2048, device=CUDA) / 45

    def inputs():  # slow to produce: a kernel on the wrong stream would read it unfinished
        y = a
        for _ in range(8):
            y = torch.tanh(y @ b)
        y = y[0, :512].reshape(8, 4, 16)
        return (y - y.min()) / (y.max() - y.min()) * 2  # spread over [0, 2]: both layers fire

    expected = net.run(net, inputs())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = net.run(net, inputs())
    torch.cuda.current_stream().wait_stream(side)
    assert expected[0].sum() > 0 and expected[1].sum() > 0
    for u, v in zip(expected, on_side):
        torch.testing.assert_close(u, v, rtol=1e-6, atol=1e-6)

    static_x = torch.zeros_like(inputs())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocate) outside the capture
        for _ in range(3):
            net.run(net, static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    net.lif.reset(), net.izh.reset()
    net.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        captured = net.run(net, static_x)
    static_x.copy_(inputs())
    graph.replay()
    torch.cuda.synchronize()
    for u, v in zip(expected, captured):
        torch.testing.assert_close(u, v, rtol=1e-6, atol=1e-6)


WARM_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from autocuda import functional as F
    from autocuda.toolchain import compile
    x = torch.rand(4, 3, 33, device="cuda", requires_grad=True)
    s, (v, w), _ = F.multi_step("izhikevich", x, a=0.1, b=0.2)
    (s.sum() + v.sum() + w.sum()).backward()
    F.multi_step("lif", x.detach().half())
    torch.cuda.synchronize()
    print(json.dumps({**compile.stats, "sympy": "sympy" in sys.modules, "cupy": "cupy" in sys.modules}))
""")


def test_second_process_with_warm_disk_cache_compiles_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CUPY_CACHE_DIR", "CUPY_CACHE_IN_MEMORY")}
    env["AUTOCUDA_CACHE_DIR"] = str(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_CACHE_SCRIPT], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    print(f"first process: {first}; second process: {second}")
    assert first.get("compiled", 0) >= 3               # izhikevich fptt + bptt, lif fptt (fp16)
    assert second.get("compiled", 0) == 0 and second.get("disk", 0) == first["compiled"]
    assert first["sympy"] and not first["cupy"], "NVRTC runs through ctypes"
    assert not second["sympy"] and not second["cupy"], "a warm process derives nothing and compiles nothing"


def test_kernels_launch_from_a_new_thread():
    """A thread where only torch ran has no current driver context; launches must bring the device's own
    (a kernel loaded on the main thread, then launched from the new thread, failed with INVALID_CONTEXT)."""
    import threading

    x = torch.rand(3, 300, device=CUDA) * 2
    want = F.multi_step("lif", x)[0]  # loads the kernel on this thread
    got, errors = [], []

    def run():
        try:
            got.append(F.multi_step("lif", x)[0])
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors
    assert torch.equal(got[0], want)


def test_backward_launches_leave_the_autograd_thread_in_the_devices_context(monkeypatch):
    """torch runs backward on its own worker thread, which starts without a current driver context: the first
    launch there makes the device's primary context current, so later backward launches switch no context."""
    from autocuda.toolchain import driver

    switches = []
    enter = driver._in_context.__enter__

    def counted(self):
        switches.append(self)
        return enter(self)
    x = (torch.rand(3, 300, device=CUDA) * 2).requires_grad_()
    # the first backward of the process may be the one that makes the context current on torch's worker thread
    torch.autograd.grad(F.multi_step("lif", x)[0].sum(), x)
    torch.cuda.synchronize()
    monkeypatch.setattr(driver._in_context, "__enter__", counted)
    for _ in range(3):
        spikes = F.multi_step("lif", x)[0]
        (grad,) = torch.autograd.grad(spikes.sum(), x)
    torch.cuda.synchronize()
    assert switches == [] and grad.abs().sum() > 0


@pytest.mark.parametrize("full", [False, True], ids=["plain", "full"])
@pytest.mark.parametrize("odd", [False, True], ids=["even", "odd"])
@pytest.mark.parametrize("long", [True, False], ids=["long", "short"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["lif", "izhikevich", "parametric_lif", "alif"])
def test_every_tuning_candidate_gives_the_fixed_rules_results(name, dtype, long, odd, full, tmp_path, monkeypatch):
    """Each layout the tuner may pick (shared-memory ring, pair copies for one half neuron per thread, vector
    accesses of 4, 8 or 16 bytes, unrolled 2 to 8 times) gives bitwise the results of the fixed rule, for long
    loops over few neurons and short ones over many, also for odd N (where half precision has no vector or pair
    layout left); ALIF's replay in 32-step segments (long loops) too. `full`: initial states as tensors, every
    state's sequence written, and gradients of the final states and of the state sequences given (the
    training step of a layer that keeps its states)."""
    from autocuda.runtime import neuron_launch as neuron
    from autocuda.runtime import tuning
    from autocuda.tools.testing import named_launch

    n = (2 * tuning.MIN_THREADS if long else tuning.LONG_LOOP_NEURONS) + odd
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    spec = resolve_spec(name)
    params = {p.name: p.default for p in spec.params if p.kind != "tensor"}
    params |= {p.name: torch.full((n,), 0.3, device=CUDA) for p in spec.params if p.kind == "tensor"}
    tensors = tuple((p.name, True) for p in spec.params if p.kind == "tensor")
    config = neuron.NeuronConfig(spec, spec.surrogate, "hard", tensors=tensors)
    steps = tuning.LONG_LOOP_STEPS + 3 if long else 5
    x = (torch.rand(steps, n, device=CUDA) * 2).to(dtype)
    g = torch.randn(steps, n, device=CUDA).to(dtype)
    inits = {s.name: torch.rand(n, device=CUDA).to(dtype) * 0.5 if full else 0.0 for s in spec.states}
    grads = {"grad_spike_seq": g}
    if full:
        grads |= {f"grad_{s.name}_final": torch.randn(n, device=CUDA).to(dtype) for s in spec.states}
        grads |= {f"grad_{s.name}_seq": torch.randn(steps, n, device=CUDA).to(dtype) for s in spec.states}

    def run(layout):
        out = named_launch.forward(config, x, inits, params, store_state_seq=full, layout=layout)
        saved = {"h_seq": out["h_seq"], "x_seq": x, **{f"{k}_init": v for k, v in inits.items()}}
        saved |= {k: v for k, v in out.items() if k.endswith(("_seq", "_checkpoints")) and k != "spike_seq"}
        return out | named_launch.backward(config, grads, saved, params, grad_state_seq=full, grad_finals=full,
                                     given_inits=full, layout=layout)

    replay = tuning.replay_option(n, steps)  # the launch's: T steps in one segment where T is shorter than one
    fixed = run({"lanes": 0, "unroll": 1, **replay})
    layouts = tuning.candidates(n, dtype, lambda width: x.data_ptr() % width == 0, long)
    assert layouts
    for layout in layouts:
        got = run({**layout, **replay})
        for key in fixed:
            assert torch.equal(got[key], fixed[key]), f"{layout}: {key} differs"
    tuned = run(None)  # the tuner's own choice (any of the above)
    assert all(torch.equal(tuned[key], fixed[key]) for key in fixed)


@pytest.mark.parametrize("channels, inner", [(4, 32768), (5, 9)], ids=["long-runs", "runs-end-inside-threads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_per_channel_parameter_gives_the_per_neuron_results_in_every_layout(dtype, channels, inner):
    """A parameter read per channel (its gradient summed per channel with atomics) and the same values read per
    neuron (one partial per neuron) give bitwise the same outputs and input gradients in every layout the tuner
    may pick, and the same per-channel sums up to their order (bounded by the sum of |partials|). Runs of one
    channel of 9 neurons end inside threads of 2, 4 or 8 neurons, and one run can span three threads."""
    from autocuda.codegen.broadcast import PER_CHANNEL, PER_NEURON
    from autocuda.runtime import neuron_launch as neuron
    from autocuda.runtime import tuning
    from autocuda.tools.testing import named_launch

    spec = resolve_spec("parametric_lif")
    # whole blocks of C runs, a multiple of 8 neurons (vector layouts), at least as many as big layers' (tuned)
    block = 8 * channels * inner
    n, steps = block * -(-tuning.LONG_LOOP_NEURONS // block), 6
    w = torch.linspace(-1, 1, channels, device=CUDA)
    x = (torch.rand(steps, n, device=CUDA) * 2).to(dtype)
    g = torch.randn(steps, n, device=CUDA).to(dtype)
    scalars = {p.name: p.default for p in spec.params if p.kind != "tensor"}

    def run(kind, layout):
        config = neuron.NeuronConfig(spec, spec.surrogate, "hard", tensors=(("w", kind),))
        per_neuron = w.repeat_interleave(inner).repeat(n // (channels * inner))
        params = dict(scalars, w=w if kind == PER_CHANNEL else per_neuron)
        if kind == PER_CHANNEL:
            params |= {"ac_channels": float(channels), "ac_inner": float(inner)}
        out = named_launch.forward(config, x, {"v": 0.0}, params, layout=layout)
        saved = {"h_seq": out["h_seq"], "x_seq": x, "v_init": 0.0}
        return out | named_launch.backward(config, {"grad_spike_seq": g}, saved, params, grad_finals=False,
                                     given_inits=False, layout=layout)

    layouts = [None, *tuning.candidates(n, dtype, lambda width: x.data_ptr() % width == 0, long=False)]
    first = run(PER_NEURON, layouts[0])
    for layout in layouts:
        by_channel, by_neuron = run(PER_CHANNEL, layout), run(PER_NEURON, layout)
        for key in by_neuron:
            if key != "grad_w":
                assert torch.equal(by_neuron[key], first[key]), f"{layout}: {key} differs from the tuned layout's"
                assert torch.equal(by_channel[key], by_neuron[key]), f"{layout}: {key} differs per channel"
        partials = by_neuron["grad_w"].reshape(-1, channels, inner).transpose(0, 1).reshape(channels, -1)
        error = (by_channel["grad_w"] - partials.sum(1)).abs()
        assert (error <= 1e-4 * partials.abs().sum(1)).all(), f"{layout}: per-channel sums differ"


@pytest.mark.parametrize("long", [True, False], ids=["long", "short"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_loops_take_the_layout_timed_fastest(tmp_path, monkeypatch, dtype, long):
    """A loop's first call (a long one over few neurons, or a short one over many) times the candidate layouts
    and keeps the fastest, on disk too; a later configuration reads it back without timing; the results are
    those of the fixed rule, bitwise."""
    from autocuda.runtime import neuron_launch as neuron
    from autocuda.runtime import tuning
    from autocuda.tools.testing import named_launch

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    spec = resolve_spec("izhikevich")
    params = {p.name: p.default for p in spec.params}
    steps, n = (tuning.LONG_LOOP_STEPS + 1, 2 * tuning.MIN_THREADS) if long else (6, tuning.LONG_LOOP_NEURONS)
    x = (torch.rand(steps, n, device=CUDA) * 2).to(dtype)
    g = torch.randn(steps, n, device=CUDA).to(dtype)

    def run(config, layout=None):
        out = named_launch.forward(config, x, {"v": 0.0, "w": 0.0}, params, layout=layout)
        saved = {"h_seq": out["h_seq"], "x_seq": x, "v_init": 0.0, "w_init": 0.0}
        grads = named_launch.backward(config, {"grad_spike_seq": g}, saved, params, grad_finals=False,
                                      given_inits=False, layout=layout)
        return out | grads

    tuned_config = neuron.NeuronConfig(spec, spec.surrogate, "hard")
    tuned = run(tuned_config)
    assert {kind for kind, *_ in tuned_config._tuned} == {"fptt", "bptt"}
    assert len(list((tmp_path / "tuning").glob("*.sha256"))) == 2
    fixed = run(neuron.NeuronConfig(spec, spec.surrogate, "hard"), layout={"lanes": 0, "unroll": 1})
    for name in fixed:
        assert torch.equal(tuned[name], fixed[name]), name

    monkeypatch.setattr(tuning, "_elapsed_ms", lambda run, flush=None: pytest.fail("timed again"))
    again = neuron.NeuronConfig(spec, spec.surrogate, "hard")
    run(again)
    assert again._tuned == tuned_config._tuned
    x, g = x[:-1], g[:-1]  # a sequence one step shorter: the same group of shapes, nothing timed
    run(tuned_config)


@pytest.mark.parametrize("name", ["lif", "parametric_lif", "izhikevich"])
def test_torchs_static_launcher_gives_the_ctypes_launchers_results(name, monkeypatch):
    """Where torch has its C++ launcher (`toolchain.launch.STATIC_LAUNCHER`), launches go through it: spikes and
    gradients bitwise those of the ctypes launch, and the static launcher is the one that ran."""
    from autocuda.call import native
    from autocuda.toolchain import launch

    monkeypatch.setattr(native, "USE", False)  # the Python path's launches are what is watched
    x = (torch.rand(6, 5000, device=CUDA) * 2).requires_grad_()
    params = {"w": torch.full((1,), 0.3, device=CUDA, requires_grad=True)} if name == "parametric_lif" else {}

    def run():
        spikes, finals, _ = F.multi_step(name, x, **params)
        leaves = [x, *params.values()]
        return [spikes, *finals, *torch.autograd.grad((spikes * torch.arange(6.0, device=CUDA)[:, None]).sum(),
                                                      leaves)]
    run()  # loads the kernels: the static launcher is looked up then
    static = launch.STATIC_LAUNCHER
    calls = []
    if static is not None:
        monkeypatch.setattr(launch, "STATIC_LAUNCHER", lambda *args: (calls.append(args[0]), static(*args))[1])
    got = run()
    monkeypatch.setattr(launch, "STATIC_LAUNCHER", None)
    want = run()
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    if static is not None:
        assert len(calls) == 2, "forward and backward through torch's launcher"
    else:
        pytest.skip(f"torch {torch.__version__} has no static CUDA launcher: compared ctypes with itself")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["lif", "izhikevich", "alif"])
def test_bound_programs_equal_the_unbound_path_on_the_gpu(name, dtype, monkeypatch):
    """Programs' bound launches (`autocuda.call.program`) on CUDA tensors, vector layouts included (N = 2**14): spikes,
    final states and the gradient bitwise the unbound path's, in inference and training, and on a side stream."""
    from autocuda.call import program

    def run(x):
        spikes, finals, _ = F.multi_step(name, x)
        if not x.requires_grad:
            return [spikes, *finals]
        return [spikes, *finals, *torch.autograd.grad((spikes * 1.5).sum() + finals[0].sum(), x)]
    for train in (False, True):
        x = (torch.rand(5, 2**14, device=CUDA) * 2).to(dtype).requires_grad_(train)
        run(x)
        got = run(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # a leaf of its own: its gradient accumulates on the side stream
            side = run(x.detach().requires_grad_(train))
        stream.synchronize()
        monkeypatch.setattr(program, "ENABLED", False)
        want = run(x)
        monkeypatch.setattr(program, "ENABLED", True)
        torch.cuda.synchronize()
        for g, s, w in zip(got, side, want):
            assert torch.equal(g, w) and torch.equal(s, w)
    assert any(p.launch is not None and key[1] == (5, 2**14) for key, p in program.PROGRAMS.items())


def test_learnable_coefficients_of_a_coupled_step_get_the_references_gradients():
    """two_compartment with g_c, tau, tau_d as Parameters (its exact 2x2 step branches on the sign of q): the CUDA
    kernels' outputs and gradients equal the reference's, in float64, where q > 0, at q = 0 (equal time constants,
    no coupling) and with a negative coupling."""
    from autocuda import nn as ann

    dtype = torch.float64
    x = torch.rand(6, 2, 50, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(1)) * 2
    weights = torch.linspace(0.5, 1.5, x.numel(), device="cuda", dtype=dtype).view(x.shape)
    for values in ({"g_c": 1.0, "tau": 2.0, "tau_d": 4.0}, {"g_c": 0.0, "tau": 3.0, "tau_d": 3.0},
                   {"g_c": -0.3, "tau": 2.0, "tau_d": 5.0}):
        found = {}
        for backend in ("reference", "cupy"):
            params = {k: torch.nn.Parameter(torch.tensor([v], device="cuda", dtype=dtype)) for k, v in values.items()}
            given = x.clone().requires_grad_()
            out = ann.Neuron("two_compartment", step_mode="m", backend=backend, **params)(given)
            (out * weights).sum().backward()
            found[backend] = (out, given.grad, *(p.grad for p in params.values()))
        for want, got in zip(found["reference"], found["cupy"]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
