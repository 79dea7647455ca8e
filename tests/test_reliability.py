"""Reliability and security on the CPU (issue 8).

1. Bad tensor input: every row of docs/bad-input.md not already covered by test_functional.py / test_nn.py, on the
   kernel path (the host runner: the generated CUDA source compiled for the CPU) and the reference path; odd
   layouts (non-contiguous, channels-last, stride-0 expanded) equal contiguous copies; NaN, +-inf and out-of-domain
   parameters propagate exactly as in the reference; initial states get gradients; double backward.
2. Untrusted specs: hypothesis fuzzing of every spec field (TOML text, as a spec file is read). Property: a
   SpecError naming the field, or an accepted spec whose CUDA source carries nothing of the raw text outside
   sanitised `//` comments and compiles with nvcc (a sample of accepted specs, batched into few nvcc calls).
3. The host runner's disk cache under faults: 8 processes (4 by default) compiling the same and different kernels into
   one fresh folder, corrupted entries (bit flips, truncation, missing or damaged checksums), a read-only folder.
4. Determinism: two host runs give bitwise-identical outputs and gradients, learnable parameters included.

Regression tests of the bugs this fuzzing and fault injection found come with each part (double backward,
generated-name collisions, unhashable table names, out-of-range constants, a damaged checksum file; the fuzzing
renders min/max/abs/heaviside gradients), spec names that made no valid kernel name.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HOST_PARAM_CLASS, compile_launched, examples, profile
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

from autocuda import nn as ann
from autocuda.base.errors import ConstantRangeError, SpecError
from autocuda.call import functional as F
from autocuda.call.memory_order import memory_order
from autocuda.spec.load import spec_from_toml
from autocuda.spec.model import NeuronSpec
from autocuda.toolchain.compile import nvcc_check, nvcc_path
from autocuda.toolchain.host import cache as host_cache
from autocuda.toolchain.host import cxx as toolchain
from autocuda.toolchain.host import runner as host_runner

REPO = Path(__file__).resolve().parents[1]
F32, F64 = torch.float32, torch.float64
NAN, INF = float("nan"), float("inf")


HOST_MISSING = toolchain.missing()
needs_host = pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")
BACKENDS = [pytest.param("host", marks=needs_host), "reference"]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of section 1's tests, compiled up front many to a compiler run (their host calls run with
    the launches recorded: `conftest.compile_launched`); the calls would compile them one a run."""
    if HOST_MISSING is not None:
        return 0
    calls = [functools.partial(test_odd_layouts_give_the_results_of_contiguous_copies, "host", layout)
             for layout in _layouts()]
    calls += [functools.partial(test_nan_and_inf_propagate_as_in_the_reference, *case) for case in SPECIAL_CASES]
    calls += [functools.partial(_training_step, name, dtype, "host") for name, dtype in REPRODUCED]
    return compile_launched(*calls, functools.partial(test_channels_last_through_a_single_step_module, "host"),
                            test_initial_states_requiring_grad_get_gradients)


def seq(*shape: int, dtype: torch.dtype = F32, seed: int = 0, low: float = -0.3, high: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=F64) * (high - low) + low).to(dtype)


# =====================================================================================================================
# 1. Bad tensor input (docs/bad-input.md)
# =====================================================================================================================
BAD_DTYPES = [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn]
ENTRY_POINTS: dict[str, Callable[[torch.Tensor], object]] = {
    "multi_step host": lambda x: F.multi_step("lif", x, backend="host"),
    "single_step": lambda x: F.single_step("lif", x[0]),
    "single_step host": lambda x: F.single_step("alif", x[0], backend="host"),
    "LIFNode m": lambda x: ann.LIFNode(step_mode="m")(x),
    "LIFNode s": lambda x: ann.LIFNode()(x[0]),
    "IzhikevichNode m": lambda x: ann.IzhikevichNode(step_mode="m", backend="host")(x),
}


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_non_floating_inputs_are_refused_on_every_path(entry, dtype):
    x = torch.zeros(2, 3).to(dtype)
    name = "x_seq" if entry.endswith(" m") or entry.startswith("multi") else "x"
    with pytest.raises(TypeError, match=rf"^{name}: expected a floating dtype \(float32, float64, float16, bfloat16\), "
                                        rf"got {re.escape(str(dtype))}$"):
        ENTRY_POINTS[entry](x)


def _multi_step_entry(entry: str) -> bool:
    return entry.endswith(" m") or entry.startswith("multi")


@pytest.mark.parametrize(("entry", "layout"), [(e, "sparse_coo") for e in ENTRY_POINTS] +  # a nested x[0] is a row
                         [(e, "nested") for e in ENTRY_POINTS if _multi_step_entry(e)])
def test_sparse_and_nested_inputs_are_refused_on_every_path(entry, layout):
    if layout == "nested":  # of [3] and [2]
        x = torch.nested.nested_tensor([torch.zeros(3), torch.zeros(2)], layout=torch.jagged)
    else:
        x = torch.zeros(2, 3).to_sparse()
    name = "x_seq" if _multi_step_entry(entry) else "x"
    kind = "nested" if layout == "nested" else "torch.sparse_coo"
    with pytest.raises(TypeError, match=rf"^{name}: expected a dense tensor, got a {kind} one \(a dense copy"):
        ENTRY_POINTS[entry](x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_a_layer_refuses_a_sparse_input_after_dense_ones(backend, step_mode):
    """The layer's keyed call (after a dense call) leaves a sparse input to the checks that name it."""
    layer = ann.LIFNode(step_mode=step_mode, backend=backend)
    x = seq(2, 3)
    x = x if step_mode == "m" else x[0]
    layer(x)
    layer(x)
    with pytest.raises(TypeError, match=r"expected a dense tensor, got a torch.sparse_coo one"):
        layer(x.to_sparse())
    layer.reset()
    layer.v_threshold = torch.ones(3).to_sparse()
    with pytest.raises(TypeError, match=r"^parameter 'v_threshold': expected a dense tensor"):
        layer(x)


BAD_STATES = [  # (what, make the state for x [2, 3], error, message)
    ("too long", lambda: torch.zeros(4), ValueError,
     r"^state 'v': expected shape \(3,\) \(the neuron shape\), got \(4,\)$"),
    ("broadcastable [1]", lambda: torch.zeros(1), ValueError, r"^state 'v': expected shape \(3,\)"),
    ("a [T, N] sequence", lambda: torch.zeros(2, 3), ValueError, r"got \(2, 3\)$"),
    ("float64", lambda: torch.zeros(3, dtype=F64), TypeError,
     r"^state 'v': expected dtype torch.float32 \(the input's\), got torch.float64$"),
    ("float16", lambda: torch.zeros(3, dtype=torch.float16), TypeError, r"got torch.float16$"),
    ("a bool", lambda: True, TypeError, r"^state 'v': expected a torch.Tensor or a number, got bool$"),
    ("a NumPy array", lambda: np.zeros(3, dtype=np.float32), TypeError, r"got ndarray$"),
    ("sparse", lambda: torch.zeros(3).to_sparse(), TypeError,
     r"^state 'v': expected a dense tensor, got a torch.sparse_coo one \(a dense copy: .to_dense\(\), or a nested "),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("make", "error", "match"), [c[1:] for c in BAD_STATES], ids=[c[0] for c in BAD_STATES])
def test_bad_initial_states_are_refused_before_launch(backend, make, error, match):
    x = seq(2, 3)
    with pytest.raises(error, match=match):
        F.multi_step("lif", x, make(), backend=backend)
    with pytest.raises(error, match=match):
        F.single_step("lif", x[0], make(), backend=backend)
    # the second state of a two-state neuron is named as such
    with pytest.raises(error, match=match.replace("'v'", "'a'")):
        F.multi_step("alif", x, torch.zeros(3), make(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_values_accepted_and_refused(backend):
    x = seq(5, 3, seed=1) * 2
    want = F.multi_step("lif", x, tau=2.5, backend=backend)
    same = {"numpy float64": np.float64(2.5), "0-dim float64 tensor": torch.tensor(2.5, dtype=F64),
            "float16 tensor": torch.tensor(2.5, dtype=torch.float16)}
    if backend == "reference":  # (on the kernel path another kernel: a per-neuron parameter; tested below)
        same["per-neuron float64 tensor"] = torch.full((3,), 2.5, dtype=F64)
    for what, tau in same.items():
        got = F.multi_step("lif", x, tau=tau, backend=backend)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1][0], want[1][0]), what
    assert torch.equal(F.multi_step("lif", x, tau=2, backend=backend)[1][0],
                       F.multi_step("lif", x, tau=2.0, backend=backend)[1][0])
    for bad, kind in [(True, "bool"), (np.float32(2.5), "float32"), (np.int64(2), "int64"), ("2.5", "str"),
                      (None, "NoneType"), ([2.5], "list")]:
        with pytest.raises(TypeError, match=rf"^parameter 'tau': expected a number or a tensor, got {kind}$"):
            F.multi_step("lif", x, tau=bad, backend=backend)
    with pytest.raises(TypeError, match=r"^parameter 'tau': expected a floating tensor, got torch.bool$"):
        F.multi_step("lif", x, tau=torch.ones(3, dtype=torch.bool), backend=backend)
    with pytest.raises(ValueError, match=r"^parameter 'tau': shape \(2, 3\) does not broadcast to the neuron shape"):
        F.multi_step("lif", x, tau=torch.ones(2, 3), backend=backend)


CONSTANT_SPEC = NeuronSpec(name="demo", charge="v + a0 * x",
                           params={"a0": {"default": 1.0, "kind": "constant"}, "v_threshold": 1.0, "v_reset": 0.0},
                           states={"v": "v_reset"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_parameter_takes_numbers_only(backend):
    x = seq(3, 4, seed=2)
    with pytest.raises(TypeError, match=r"^parameter 'a0' is a compile-time constant of 'demo': pass a number$"):
        F.multi_step(CONSTANT_SPEC, x, a0=torch.tensor(2.0), backend=backend)
    v = F.multi_step(CONSTANT_SPEC, x, a0=0.5, reset="none", backend="reference")[1][0]
    torch.testing.assert_close(v, 0.5 * x.sum(0))


@needs_host
def test_other_arguments():
    x = seq(4, 3, seed=3) * 2
    with pytest.raises(SpecError, match=r"^lif.toml: field 'reset': reset must be one of hard, soft, none$"):
        F.multi_step("lif", x, reset="hardd", backend="host")
    with pytest.raises(SpecError, match=r"field 'surrogate.name': unknown surrogate 'Foo'"):
        F.multi_step("lif", x, surrogate="Foo", backend="host")
    with pytest.raises(SpecError, match=r"field 'surrogate.gradient': attribute access not allowed"):
        F.multi_step("lif", x, surrogate={"name": "Custom", "gradient": "x.real"}, backend="host")
    with pytest.raises(ValueError, match=r"^backend: expected 'cuda', 'host', 'reference' or None, got 'gpu'$"):
        F.multi_step("lif", x, backend="gpu")
    # backend="cuda" with CPU tensors: the generated kernels through the host runner
    host, cuda = F.multi_step("lif", x, backend="host"), F.multi_step("lif", x, backend="cuda")
    assert torch.equal(host[0], cuda[0]) and torch.equal(host[1][0], cuda[1][0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_steps_returns_the_initial_states_and_passes_their_gradients(backend):
    x = torch.zeros(0, 2, 3, requires_grad=True)
    v0, a0 = seq(2, 3, seed=4).requires_grad_(), seq(2, 3, seed=5).requires_grad_()
    spikes, (v, a), (v_seq, a_seq) = F.multi_step("alif", x, v0, a0, store_state_seq=True, backend=backend)
    assert spikes.shape == v_seq.shape == a_seq.shape == (0, 2, 3)
    assert v is v0 and a is a0  # the initial states themselves (docs/bad-input.md)
    w = seq(2, 3, seed=6)
    grad_v0, grad_a0, grad_x = torch.autograd.grad((v * w).sum() + 2 * a.sum() + spikes.sum(), (v0, a0, x),
                                                   allow_unused=True)
    assert torch.equal(grad_v0, w) and torch.equal(grad_a0, torch.full_like(a0, 2.0))
    assert grad_x is None or grad_x.shape == (0, 2, 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(3, 0), (3, 2, 0), (3, 0, 4)], ids=str)
def test_empty_neuron_dimension(backend, shape):
    x = torch.zeros(shape, requires_grad=True)
    spikes, (v, a), (v_seq, a_seq) = F.multi_step("alif", x, store_state_seq=True, backend=backend)
    assert spikes.shape == v_seq.shape == a_seq.shape == shape and v.shape == a.shape == shape[1:]
    (spikes.sum() + v.sum() + a_seq.sum()).backward()
    assert x.grad.shape == shape
    spike, (v, a) = F.single_step("alif", torch.zeros(shape[1:]), backend=backend)
    assert spike.shape == v.shape == a.shape == shape[1:]
    assert ann.LIFNode(step_mode="m", backend=backend)(torch.zeros(shape)).shape == shape


def _layouts() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """name -> (leaf -> an oddly laid out input [T, *] built from it by views only). Leaves are [2, 3, 4, 5]."""
    return {
        "transposed": lambda b: b.reshape(2, 3, 20).transpose(1, 2),                     # [2, 20, 3]
        "every other step": lambda b: b.reshape(4, 30)[::2],                             # [2, 30]
        "every third neuron": lambda b: b.reshape(2, 60)[:, 1::3],                       # [2, 20]
        "channels-last": lambda b: b.contiguous(memory_format=torch.channels_last),      # [T=2, C=3, H=4, W=5]
        "channels-last-3d": lambda b: b.reshape(2, 3, 2, 2, 5).contiguous(memory_format=torch.channels_last_3d),
        "expanded over time": lambda b: b[:1].expand(6, 3, 4, 5),                        # stride 0 on T
        "expanded over batch": lambda b: b[:, :1].expand(2, 7, 4, 5),                   # stride 0 on a neuron dim
        "one value everywhere": lambda b: b.reshape(-1)[int(b.argmax())].expand(3, 4, 5),  # every stride 0
    }


DENSE_LAYOUTS = ("transposed", "channels-last", "channels-last-3d")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(_layouts()))
def test_odd_layouts_give_the_results_of_contiguous_copies(backend, layout):
    view = _layouts()[layout]
    leaf = (seq(2, 3, 4, 5, seed=7, dtype=F64) * 2).requires_grad_()
    assert not view(leaf).is_contiguous()
    results = []
    for make_input in (lambda: view(leaf), lambda: view(leaf).contiguous()):
        leaf.grad = None
        x = make_input()
        spikes, (v,), (v_seq,) = F.multi_step("lif", x, store_state_seq=True, backend=backend)
        assert spikes.shape == v_seq.shape == x.shape and v.shape == x.shape[1:]
        weights = torch.linspace(-1, 2, spikes.numel(), dtype=F64).reshape(spikes.shape)
        ((spikes * weights).sum() + (v_seq * weights).sum() + v.sum()).backward()
        results.append([spikes.detach(), v.detach(), v_seq.detach(), leaf.grad.clone()])
    odd_result, copy_result = results
    assert odd_result[0].sum() > 0  # some neurons fire
    for what, a, b in zip(("spikes", "final v", "v_seq", "grad of the leaf"), odd_result, copy_result):
        assert torch.equal(a, b), f"{layout}: {what} differs from the contiguous copy's"
    # a layout dense in another order runs where it lies and keeps its layout; the others are copied
    x = view(leaf)
    assert (memory_order(x, 1, (), {}) is not None) == (layout in DENSE_LAYOUTS)
    for out in (odd_result[0], odd_result[2]):
        assert out.stride() == x.stride() if layout in DENSE_LAYOUTS else out.is_contiguous()


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_through_a_single_step_module(backend):
    x = (seq(2, 3, 4, 5, seed=8) * 2).contiguous(memory_format=torch.channels_last)
    odd, plain = ann.LIFNode(backend=backend), ann.LIFNode(backend=backend)
    for _ in range(3):
        assert torch.equal(odd(x), plain(x.contiguous()))
    assert torch.equal(odd.v, plain.v)


def _specials_agree(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    """Same NaN, +inf and -inf positions; the finite values equal up to rtol (operation order differs)."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    for name, test in (("NaN", torch.isnan), ("+inf", lambda t: t == INF), ("-inf", lambda t: t == -INF)):
        assert torch.equal(test(got), test(want)), f"{what}: {name} positions differ:\n{got}\n{want}"
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=rtol, atol=rtol, msg=what)


def _special_case(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Inputs [5, 12], initial states and a per-neuron tau with NaN and +-inf at known places."""
    x = seq(5, 12, dtype=dtype, seed=11) * 2
    x[0, 0], x[2, 1], x[1, 2], x[3, 3], x[4, 4], x[0, 5] = NAN, NAN, INF, -INF, INF, -INF
    states = [seq(12, dtype=dtype, seed=12 + i) * 0.5 for i in range(2 if name == "alif" else 1)]
    states[0][6], states[-1][7] = NAN, INF
    tau = torch.full((12,), 2.5, dtype=dtype)
    tau[8], tau[9], tau[10], tau[11] = INF, 0.0, NAN, -1.0
    return x, states, tau


SPECIAL_CASES = [("lif", "hard", F32), ("lif", "hard", F64), ("lif", "soft", F32), ("alif", "hard", F32)]


@needs_host
@pytest.mark.parametrize(("name", "reset", "dtype"), SPECIAL_CASES, ids=str)
def test_nan_and_inf_propagate_as_in_the_reference(name, reset, dtype):
    x, states, tau = _special_case(name, dtype)
    runs = {}
    for backend in ("host", "reference"):
        leaves = [x.clone().requires_grad_(), *(s.clone().requires_grad_() for s in states),
                  tau.clone().requires_grad_()]
        spikes, finals, seqs = F.multi_step(name, leaves[0], *leaves[1:-1], tau=leaves[-1], reset=reset,
                                            store_state_seq=True, backend=backend)
        outputs = [spikes, *finals, *seqs]
        weights = [seq(*o.shape, dtype=dtype, seed=20 + i) for i, o in enumerate(outputs)]
        grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), leaves)
        runs[backend] = [o.detach() for o in outputs], list(grads)
    (out, grads), (want_out, want_grads) = runs["host"], runs["reference"]
    assert torch.equal(out[0], want_out[0]), "spikes"
    assert out[0][:, 2].sum() >= 1 and out[0][4, 4] == 1  # +inf spikes
    rtol = 1e-5 if dtype == F32 else 1e-12
    for i, (a, b) in enumerate(zip(out[1:], want_out[1:])):
        _specials_agree(f"output {i + 1}", a, b, rtol)
    for what, a, b in zip(["grad x", *(f"grad state {i}" for i in range(len(states))), "grad tau"], grads,
                          want_grads):
        _specials_agree(what, a, b, rtol)
    v_seq = out[1 + len(states)]
    assert torch.isnan(v_seq[:, 0]).all() and torch.isnan(v_seq[2:, 1]).all()  # NaN in: NaN membrane from then on


# `w` records k * x and no step reads it: before the last step autograd's graph holds no path from the loss to it
RECORDER = NeuronSpec(name="recorder", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0,
                                               "k": {"default": 1.0, "learnable": True}},
                      states={"v": "v_reset", "w": 0.0}, charge="v + (x - (v - v_reset)) / tau",
                      updates={"w": "k * x"})


@needs_host
@pytest.mark.parametrize("finals", [True, False], ids=["final-gradients", "spikes-alone"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_a_state_that_no_step_reads_takes_no_nan_from_the_steps_before_the_last(finals, dtype):
    """A state's gradient is 0 before the last step where no step reads it: the kernels leave its terms out there,
    as the reference (autograd) does, so a NaN or inf partial (here k) does not make 0 * NaN a NaN gradient of x
    at every step; at the last step both take the final state's gradient through it."""
    x = seq(6, 5, dtype=dtype, seed=15) * 2
    k = torch.tensor([1.0, 0.5, NAN, INF, -INF], dtype=dtype)
    runs = []
    for backend in ("host", "reference"):
        leaf, gain = x.clone().requires_grad_(), k.clone().requires_grad_()
        spikes, (v, w), _ = F.multi_step(RECORDER, leaf, k=gain, backend=backend)
        loss = (spikes * seq(6, 5, dtype=dtype, seed=16)).sum()
        if finals:
            loss = loss + (v * seq(5, dtype=dtype, seed=17)).sum() + w.nan_to_num(0.0, 0.0, 0.0).sum()
        grads = torch.autograd.grad(loss, (leaf, gain), allow_unused=True)  # k: unused by the spikes alone
        runs.append((spikes.detach(), w.detach(), *(torch.zeros_like(k) if g is None else g for g in grads)))
    for what, got, want in zip(("spikes", "w", "grad x", "grad k"), *runs):
        _specials_agree(what, got, want, 1e-5 if dtype == F32 else 1e-12)
    assert torch.isfinite(runs[0][2][:-1]).all()  # before the last step: the w path adds nothing


@needs_host
@pytest.mark.parametrize("single", [False, True], ids=["sequence", "steps"])
def test_an_infinite_input_at_the_last_step_leaves_the_gradients_of_a_loss_of_spikes_finite(single):
    """Found by a probe of the surrogates at extreme arguments: an input of inf at the last step makes LIF's hard
    reset's partial v_reset - h infinite. A loss of the spikes alone reads no final state, so autograd holds no path
    through that reset; the kernels, whose λ of the final states was a zero, made 0 * inf a NaN there and carried it
    to every step's gradient. Where they take no final state's gradient they now leave those terms out."""
    x = torch.tensor([[0.5, 2.0], [0.7, -1.0], [INF, -INF]], dtype=F64)
    grads = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        if single:
            v, spikes = 0.0, []
            for step in leaf:
                spike, (v,) = F.single_step("lif", step, v, backend=backend)
                spikes.append(spike)
            spikes = torch.stack(spikes)
        else:
            spikes = F.multi_step("lif", leaf, backend=backend)[0]
        grads.append(torch.autograd.grad((spikes * torch.tensor([1.0, 2.0], dtype=F64)).sum(), leaf)[0])
    assert torch.isfinite(grads[1]).all()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


@needs_host
def test_a_final_state_left_out_of_a_loss_that_reads_another_has_a_zero_gradient():
    """The one NaN difference docs/bad-input.md records: the kernels take the final states' gradients all or none, so
    w's final, unread by a loss that reads v's, gets a zero gradient, which its NaN and inf partials (k) make NaN
    at the last step; autograd holds no path there. The steps before agree."""
    x = seq(6, 5, dtype=F64, seed=18) * 2
    k = torch.tensor([1.0, 0.5, NAN, INF, -INF], dtype=F64)
    grads = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        spikes, (v, _), _ = F.multi_step(RECORDER, leaf, k=k, backend=backend)
        grads.append(torch.autograd.grad(spikes.sum() + v.sum(), leaf)[0])
    _specials_agree("grad x before the last step", grads[0][:-1], grads[1][:-1], 1e-12)
    assert torch.isnan(grads[0][-1, 2:]).all() and torch.isfinite(grads[1][-1]).all()


def _maxed(threshold: str, rectified: str = "max(x, 0)") -> NeuronSpec:
    """A LIF that charges with `rectified` and a threshold of `threshold`, which reads a tensor parameter k."""
    return NeuronSpec(name="maxed", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0,
                                            "k": {"default": 0.0, "kind": "tensor"}},
                      states={"v": "v_reset"}, charge=f"v + ({rectified} - (v - v_reset)) / tau", threshold=threshold)


def _maxed_runs(threshold: str, rectified: str = "max(x, 0)") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(spikes, x's gradient of their sum), host then reference, for neurons whose k is 0, NaN, 0."""
    x = seq(6, 3, dtype=F64, seed=19) * 4 - 1
    runs = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        spikes, _, _ = F.multi_step(_maxed(threshold, rectified), leaf, k=torch.tensor([0.0, NAN, 0.0], dtype=F64),
                                    backend=backend)
        runs.append((spikes.detach(), torch.autograd.grad(spikes.sum(), leaf)[0]))
    return runs


@needs_host
def test_max_of_a_nan_is_nan_in_the_kernels_as_in_the_reference():
    """The kernels' max is torch.maximum's (C's fmax would give the other operand): a threshold max(v_threshold, k)
    with k NaN is NaN, and that neuron never fires, in both."""
    (spikes, _), (want, _) = _maxed_runs("max(v_threshold, k)")
    assert torch.equal(spikes, want)
    assert spikes[:, [0, 2]].sum() >= 1 and spikes[:, 1].sum() == 0


@needs_host
@pytest.mark.parametrize("threshold", ["max(v_threshold, k)", "min(v_threshold, k)", "max(v_threshold, w)",
                                       "min(w, v_threshold)"])
def test_min_and_max_of_numbers_keep_a_nan_in_the_reference_as_in_the_kernels(threshold):
    """Found by a wider fuzz: the reference took min and max of parameters given as numbers by Python's, which drop a
    NaN in the second place (min(-2.0, nan) is -2.0), and fired where the kernels' NaN threshold never does. sympy
    orders the operands by name: w stands after v_threshold, k before it."""
    spec = NeuronSpec(name="maxed", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, "k": 0.0, "w": 0.0},
                      states={"v": "v_reset"}, charge="v + (x - (v - v_reset)) / tau", threshold=threshold)
    x = seq(6, 3, dtype=F64, seed=19) * 4 - 1
    spikes, want = (F.multi_step(spec, x, k=NAN, w=NAN, backend=backend)[0] for backend in ("host", "reference"))
    assert torch.equal(spikes, want) and spikes.sum() == 0


@needs_host
def test_a_float64_call_runs_a_spec_whose_float32_kernels_cannot_hold_its_constants():
    """Found by a wider fuzz: the derivative of erf at 1e30 folds the constant 1e60, which float32 cannot hold. The
    names of the ops' outputs and saved tensors were read from the float32 kernels, so a float64 training call was
    refused for float32's range; now it runs (as the reference), and a float32 one is refused at its backward,
    naming float32."""
    spec = NeuronSpec(name="wide", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}, states={"v": "v_reset"},
                      charge="v + (x - (v - v_reset)) / tau", threshold="erf(where(v < 1e30, 1e30, v))")
    x = seq(6, 3, dtype=F64, seed=23) * 4
    runs = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        spikes = F.multi_step(spec, leaf, backend=backend)[0]
        runs.append((spikes.detach(), torch.autograd.grad((spikes * x).sum(), leaf)[0]))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][0].sum() > 0
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-12, atol=1e-12)
    leaf = x.float().requires_grad_()
    with pytest.raises(ConstantRangeError, match="float32") as refused:
        F.multi_step(spec, leaf, backend="host")[0].sum().backward()
    assert refused.value.field == "params"


@needs_host
def test_a_constant_that_a_dtype_would_read_as_zero_is_refused_as_one_beyond_its_range():
    """Found by a probe: 1e-60 was printed as 1e-60f, which is 0 in float32, so x * 1e-60 * a * b (a = b = 1e30) was 0
    in the float32 kernels and x in the reference. A float32 call is refused, naming the constant; float64 runs."""
    spec = NeuronSpec(name="tiny", params={"v_threshold": 1.0, "v_reset": 0.0, "a": 1e30, "b": 1e30},
                      states={"v": 0.0}, charge="v + x * 1e-60 * a * b", reset="none")
    x = torch.tensor([[0.5, -0.5, 2.0]], dtype=F64)
    finals = [F.multi_step(spec, x, backend=backend)[1][0] for backend in ("host", "reference")]
    torch.testing.assert_close(finals[0], x[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(finals[1], x[0], rtol=1e-12, atol=0)
    with pytest.raises(ConstantRangeError, match="1e-60 is below the smallest float32"):
        F.multi_step(spec, x.float(), backend="host")


@needs_host
def test_an_infinite_gradient_meets_the_resets_terms_one_by_one_in_autograd():
    """A NaN difference docs/bad-input.md records (found by a fuzz): after a hard reset to 0 the threshold -sqrt(v)
    has an infinite derivative. Autograd multiplies it by each term of the reset, h (1 - s) + s v_reset, so by
    v_reset = 0 too (inf * 0: NaN); the kernels by the reset's derivative in s as one term, v_reset - h: -inf."""
    spec = NeuronSpec(name="rooted", params={"v_threshold": 1.0, "v_reset": 0.0}, states={"v": "v_reset"},
                      charge="0.5", threshold="-sqrt(v)")
    grads = []
    for backend in ("host", "reference"):
        v0 = torch.tensor([0.5, 2.0, 0.0], dtype=F64, requires_grad=True)
        spikes = F.multi_step(spec, torch.zeros(2, 3, dtype=F64), v0, backend=backend)[0]
        grads.append(torch.autograd.grad(spikes.sum(), v0)[0])
    assert torch.equal(grads[0], torch.full((3,), -INF, dtype=F64)) and torch.isnan(grads[1]).all()


@needs_host
@pytest.mark.parametrize("charge", ["min(x, k)", "max(k, x)", "min(x, 0.5)"])
def test_min_and_max_of_a_number_split_the_gradient_at_a_tie_in_the_reference_as_in_the_kernels(charge):
    """Found by a wider fuzz: the reference took min and max of a tensor and a number by torch.clamp, which gives the
    tensor the whole gradient at a tie, where the kernels (and torch.minimum of two tensors) split it evenly, as
    docs/spec-format.md says; a hard reset to a state's value equal to k made the tie in a fuzzed spec."""
    spec = NeuronSpec(name="tied", params={"k": 0.5, "v_threshold": 0.25, "v_reset": 0.0}, states={"v": "v_reset"},
                      charge=charge)
    x = torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 0.0]], dtype=F64)
    grads = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        spikes = F.multi_step(spec, leaf, backend=backend)[0]
        grads.append(torch.autograd.grad(spikes.sum(), leaf)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
    sigmoid = 4 * torch.sigmoid(torch.tensor(1.0)) * (1 - torch.sigmoid(torch.tensor(1.0)))  # at h - 0.25 = 0.25
    assert grads[1][0, 0] == pytest.approx(float(sigmoid) / 2, rel=1e-6)  # the tie x = 0.5 = k: half


@needs_host
@pytest.mark.parametrize("rectified", ["max(x, 0)", "where(x > 0, x, 0)"])
def test_the_derivative_of_max_multiplies_where_autograd_masks(rectified):
    """A NaN difference docs/bad-input.md records: the kernels' derivative of max(x, 0) (and of a where) is a 0/1
    factor, so a NaN gradient (here the surrogate's of a NaN threshold) stays NaN where x < 0; autograd's masks it
    to 0 there."""
    x = seq(6, 3, dtype=F64, seed=19) * 4 - 1
    (spikes, grad), (want, want_grad) = _maxed_runs("v_threshold + k", rectified)
    assert torch.equal(spikes, want)
    _specials_agree("grad x of the finite neurons", grad[:, [0, 2]], want_grad[:, [0, 2]], 1e-12)
    assert torch.isnan(grad[:, 1]).all()
    assert torch.equal(torch.isnan(want_grad[:, 1]), x[:, 1] > 0) and (want_grad[:, 1][x[:, 1] <= 0] == 0).all()


@needs_host
def test_a_branch_not_chosen_that_is_nan_makes_autograds_gradient_nan_not_the_kernels():
    """The other side of the case above, docs/bad-input.md records it too: where(x > 0, sqrt(x), -x) evaluates sqrt
    of a negative x, NaN, on the branch not chosen; autograd multiplies its derivative by the 0 where passes it, so
    the reference's gradient is NaN there, and the kernels' derivative chooses the branch: -1."""
    spec = NeuronSpec(name="rooted", params={"v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0},
                      charge="v + where(x > 0, sqrt(x), -x)", reset="none")
    x = torch.tensor([[4.0, -1.0, -0.25]], dtype=F64)
    grads = []
    for backend in ("host", "reference"):
        leaf = x.clone().requires_grad_()
        _, (v,), _ = F.multi_step(spec, leaf, backend=backend)
        grads.append(torch.autograd.grad(v.sum(), leaf)[0])
    assert grads[0].tolist() == [[0.25, -1.0, -1.0]]
    assert grads[1][0, 0] == 0.25 and torch.isnan(grads[1][0, 1:]).all()


@needs_host
@pytest.mark.parametrize("tau", [0.0, -1.0, 1e-30, INF, NAN], ids=str)
def test_out_of_domain_tensor_parameters_are_not_checked_and_match_the_reference(tau):
    """tau <= 0 (and NaN) given as a tensor is not refused (numbers are: LIF's tau has the domain "> 0"): no check,
    the kernels compute what the reference computes (inf, NaN or growing states). docs/bad-input.md records what
    each gives."""
    x = seq(6, 5, seed=13) * 2
    tau = torch.tensor(tau)
    (spikes, (v,), _), (want_spikes, (want_v,), _) = (F.multi_step("lif", x, tau=tau, backend=backend)
                                                      for backend in ("host", "reference"))
    assert torch.equal(spikes, want_spikes)
    _specials_agree(f"v at tau={tau}", v, want_v, 1e-6)
    node = ann.LIFNode(tau=tau, step_mode="m", backend="host")  # accepted by the module too
    assert torch.equal(node(x), spikes)
    if tau == 0.0:  # h = v + (x - v) / 0 is +-inf; +inf spikes, and inf * (1 - s) under the hard reset is NaN
        assert torch.equal(spikes[0], (x[0] > 0).float()) and torch.isnan(v[x[0] > 0]).all()


@needs_host
def test_initial_states_requiring_grad_get_gradients():
    x = seq(6, 2, 5, seed=14) * 2
    tau = torch.full((2, 5), 2.5)  # (a per-neuron tau needing a gradient: the kernels of the NaN test above)
    runs = []
    for backend in ("host", "reference"):
        leaves = [x.clone().requires_grad_(), *(seq(2, 5, seed=15 + i).requires_grad_() for i in range(2)),
                  tau.clone().requires_grad_()]
        spikes, finals, seqs = F.multi_step("alif", *leaves[:3], tau=leaves[3], store_state_seq=True,
                                            backend=backend)
        loss = (spikes * seq(6, 2, 5, seed=17)).sum() + sum((f * f).sum() for f in finals) + seqs[1].sum()
        runs.append(torch.autograd.grad(loss, leaves))
    for what, got, want in zip(("x", "v", "a", "tau"), *runs):
        assert got.abs().sum() > 0, what
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=what)


def _first_order(backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = (seq(4, 6, dtype=F64, seed=18) * 2).requires_grad_()
    spikes, (v,), _ = F.multi_step("lif", x, store_state_seq=True, backend=backend)  # (the layout test's kernels)
    (grad_x,) = torch.autograd.grad((spikes * seq(4, 6, dtype=F64, seed=19)).sum() + v.sum(), x, create_graph=True)
    return x, grad_x


@needs_host
def test_double_backward_through_the_kernels_raises_instead_of_being_silently_wrong():
    """The kernels are differentiable once. With create_graph=True their gradients must not pass for
    differentiable: a gradient penalty built on them would silently lose its second-order part."""
    x, grad_x = _first_order("host")
    with pytest.raises(RuntimeError, match="differentiable once"):  # (torch's once_differentiable: "... not have
        torch.autograd.grad(grad_x.sum(), x)                          # been used in the graph")
    x, grad_x = _first_order("host")
    with pytest.raises(RuntimeError, match="differentiable once"):  # a gradient penalty
        ((grad_x ** 2).sum() + (x ** 2).sum()).backward()
    x, grad_x = _first_order("host")
    with pytest.raises(RuntimeError, match="differentiable once"):  # the same toward x alone: torch's
        torch.autograd.grad((grad_x ** 2).sum() + (x ** 2).sum(), x)  # once_differentiable gives 2x, silently


def test_double_backward_through_the_reference_is_differentiable():
    x, grad_x = _first_order("reference")
    assert grad_x.requires_grad
    (second,) = torch.autograd.grad((grad_x ** 2).sum(), x)
    assert torch.isfinite(second).all() and second.abs().sum() > 0


# =====================================================================================================================
# 2. Untrusted specs: fuzzing every field
# =====================================================================================================================
# Examples per field (parse-level property; ~4 ms each): fields whose text can reach the CUDA source get
# FUZZ_EXAMPLES (100 with --slow, 20 by default), fields with a few valid values (reset, kind, option values, ...)
# half as many. Raise it with AUTOCUDA_FUZZ_EXAMPLES (300: about a minute more on 2 cores). Each field has its own
# fixed seed: CI sees the same examples every run, and no two fields the same draws.
FUZZ_EXAMPLES = int(os.environ.get("AUTOCUDA_FUZZ_EXAMPLES", examples(100, 20)))
RENDER_PER_FIELD = 1     # accepted specs per field whose kernels are rendered and checked (derivation: ~0.3 s)
FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))

# The discrete base spec: two extra states, a learnable tensor, a constant, a derived quantity, an option, a
# user surrogate.
BASE: dict = {
    "name": "fuzz", "doc": "fuzzing base",
    "charge": "v + (x - (v - v_reset)) / tau + k * c if decay_input else v + x",
    "threshold": "v_threshold + beta * a",
    "reset": "hard",
    "params": {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0,
               "beta": {"default": 0.2, "kind": "scalar", "doc": "adaptation"},
               "k": {"default": 0.1, "kind": "constant"}, "g": {"default": 0.0, "kind": "tensor", "learnable": True}},
    "states": {"v": "v_reset", "a": 0.0, "c": 0.0},
    "updates": {"a": "0.9 * a + s * ge", "c": "0.5 * c + 0.1 * h - 0.2 * s"},
    "derived": {"ge": "sigmoid(g)"},
    "options": {"decay_input": True},
    "surrogate": {"name": "Custom", "gradient": "alpha / (1 + alpha * x * x)", "alpha": 2.0},
}
# The continuous base spec (euler takes any right-hand side and is cheap to derive).
ODE_BASE: dict = {
    "name": "fuzz_ode", "method": "euler",
    "params": {"tau": 2.0, "tau_w": 5.0, "b": 0.1, "v_threshold": 1.0, "v_reset": 0.0},
    "states": {"v": "v_reset", "w": 0.0},
    "ode": {"v": "(-v + x - w) / tau", "w": "-w / tau_w"},
    "jumps": {"w": "w + b"},
}
TOML_KEYS = ("name", "doc", "params", "states", "charge", "threshold", "reset", "updates", "derived", "options",
             "surrogate", "ode", "jumps", "method", "output", "levels", "inputs", "fires_at",
             "detach_reset")


def _toml_string(text: str) -> str:
    escaped = "".join('\\"' if c == '"' else "\\\\" if c == "\\" else
                      f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)
    return f'"{escaped}"'


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def to_toml(data: dict) -> str:
    """TOML text of `data` (every key quoted, every table inline): what an untrusted spec file could hold."""
    return "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in data.items())


def _copy(data: dict) -> dict:
    return {k: (_copy(v) if isinstance(v, dict) else v) for k, v in data.items()}


def _set(data: dict, path: tuple[str, ...], value) -> dict:
    out = _copy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _rename(data: dict, group: str, old: str, new: str) -> dict:
    """`old` (declared in `group`) renamed to `new` in its declaration and in every expression that uses it."""
    def expr(text):
        return re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", lambda _: new, text) if isinstance(text, str) else text

    out = _copy(data)
    for key in ("charge", "threshold"):
        if key in out:
            out[key] = expr(out[key])
    for key in ("updates", "ode", "jumps", "states", "derived"):
        if key in out:  # a state's update / ode / jump is keyed by the state's name
            out[key] = {(new if key != "derived" and n == old else n): expr(t) for n, t in out[key].items()}
    keep = (lambda n, t: expr(t) if n == "gradient" else t) if group == "surrogate" else (lambda n, t: t)
    out[group] = {(new if n == old else n): keep(n, t) for n, t in out[group].items()}
    return out


# -- strategies -------------------------------------------------------------------------------------------------
DANGEROUS = ["/*", "*/", "//", "#define X 1", "\n#include <stdio.h>\n", '#include "x.h"', "#", 'asm("trap;")', "asm",
             "__asm__", "__import__('os')", "exec('1')", "eval", "().__class__.__bases__", "x.real", "lambda: 1",
             "threadIdx.x", "blockIdx", "__syncthreads()", "int", "float", "return", "goto", ";", "{", "}", "\\",
             "\\\n", '"', "'", "??/", "?", ":", 'printf("%d")', "\r", "\t", "\x00", "\u2028", "\ufeff", "\uff58", "é",
             "__global__", 'extern "C"', "`", "@", "$", "x; }", "} void f() {", "*/ int y; /*", "1e400", "9**9**9",
             "0x1p3", "1j", "(" * 80 + "x" + ")" * 80, "-" * 100 + "x", "x" + " + x" * 700]
FUNCTIONS_1 = ["exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "atan", "sigmoid", "erf", "abs", "heaviside"]
NUMBERS = st.one_of(st.integers(0, 10**32).map(str), st.floats(0, 1e31, allow_nan=False).map(repr),
                    st.sampled_from(["1e30", "1e-30", "1e-320", "5e-324", "0x7fffffff", "1_000", "0.0", "0b101",
                                     "3.4028235e38", "1e31", "0o17", "1.", ".5", "00"]))


def valid_expressions(names: list[str], options: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    """Expressions over `names` in the whitelisted grammar (some are still refused: a constant past 1e30, a
    sqrt of a negative constant, ...)."""
    leaf = st.one_of(st.sampled_from([*names, "pi", "e"]), NUMBERS)

    def extend(inner):
        branches = [
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(FUNCTIONS_1), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
            st.tuples(inner, st.sampled_from(["<", "<=", ">", ">="]), inner, inner, inner).map(
                lambda t: f"where({t[0]} {t[1]} {t[2]}, {t[3]}, {t[4]})"),
            inner.map(lambda t: f"-{t}"),
        ]
        if options:
            branches.append(st.tuples(inner, st.sampled_from(options), inner).map(
                lambda t: f"({t[0]} if {t[1]} else {t[2]})"))
        return st.one_of(*branches)

    return st.recursive(leaf, extend, max_leaves=10)


def expressions(names: list[str], options: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    """Random text, token soup with dangerous tokens, deep nesting, valid expressions, valid ones with junk."""
    soup = st.lists(st.one_of(st.sampled_from(names + DANGEROUS + FUNCTIONS_1 + [
        "min", "max", "where", "(", ")", ",", "+", "-", "*", "/", "**", "<", ">=", "==", "if",
        "else", "and", "not", "lambda", ".", "[", "]", *options]), NUMBERS), max_size=24).map(" ".join)
    nested = st.one_of(st.integers(1, 90).map(lambda n: "(" * n + names[0] + ")" * n),
                       st.integers(1, 90).map(lambda n: "exp(" * n + names[0] + ")" * n),
                       st.integers(1, 120).map(lambda n: "-" * n + names[0]),
                       st.integers(1, 60).map(lambda n: " ** ".join([names[0]] * n)))
    valid = valid_expressions(names, options)
    return st.one_of(st.text(max_size=60), soup, nested, valid, valid,
                     st.tuples(valid, st.sampled_from(DANGEROUS)).map(" ".join),
                     st.tuples(st.sampled_from(DANGEROUS), valid).map(" ".join))


C_AND_CUDA_NAMES = ["int", "float", "double", "return", "asm", "if", "for", "while", "goto", "void", "const", "static",
                    "unsigned", "signed", "restrict", "volatile", "extern", "struct", "sizeof", "threadIdx",
                    "blockIdx", "blockDim", "gridDim", "warpSize", "__syncthreads", "__global__", "__device__",
                    "printf", "malloc", "half", "half2", "nv_bfloat16", "float2", "float4", "int4", "dim3", "size_t",
                    "expf", "powf", "fabs", "fminf", "INFINITY", "NAN", "NULL", "M_PI", "std", "main", "define",
                    "include", "pragma", "index", "numel", "N", "T", "t", "dt", "lane", "word", "ac_v", "ac_",
                    "x", "h", "s", "pi", "e", "exp", "where", "sigmoid", "heaviside", "min", "max", "abs",
                    "time_step", "decay_input", "v", "a", "c", "tau", "beta", "k", "g", "ge", "alpha", "gradient",
                    "name"]
IDENTIFIERS = st.one_of(
    st.text(max_size=14), st.sampled_from(C_AND_CUDA_NAMES),
    st.sampled_from(["_v", "v_", "__v", "v__w", "1v", "v-w", "v w", "a" * 32, "a" * 33, "a" * 63, "a" * 64, "ß",
                     "\uff56", "v\u200b", "v\n", "asmx", "threadIdx_", "intx", "Int", "nan", "inf", "NaN", "main_"]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,40}", fullmatch=True))
TOML_VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=20),
              st.sampled_from(["hard", "soft", "none", "exact", "euler", "Sigmoid", "Custom", "v", "x"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
TEXTS = st.one_of(st.text(max_size=80), st.sampled_from(DANGEROUS),
                  st.lists(st.sampled_from([*DANGEROUS, "ok", " "]), max_size=8).map("".join))


@dataclasses.dataclass(frozen=True)
class Target:
    """One spec field under fuzzing: `build(value)` is the spec data, `fields(value)` the error fields allowed
    (an error's field must equal one or start with one and a dot)."""

    name: str
    values: st.SearchStrategy
    build: Callable[[object], dict]
    fields: Callable[[object], tuple[str, ...]]
    renders: bool = True    # accepted values can reach the generated source: render and check a sample

    @property
    def examples(self) -> int:
        return FUZZ_EXAMPLES if self.renders else max(1, FUZZ_EXAMPLES // 2)


def _at(base: dict, *path: str) -> Callable[[object], dict]:
    return lambda value: _set(base, path, value)


def _exact(*fields: str) -> Callable[[object], tuple[str, ...]]:
    return lambda value: fields


def _renamed(base: dict, group: str, old: str) -> Target:
    def fields(new) -> tuple[str, ...]:
        # the declaration; a clash with a name declared elsewhere; a (now) ill-formed reference to it
        uses = ("charge", "threshold", "updates", "derived", "surrogate.gradient")
        return (f"{group}.{new}", group, *(f"{g}.{new}" for g in ("params", "states", "derived", "options")), *uses)
    return Target(f"{group} name ({old})", IDENTIFIERS, lambda new: _rename(base, group, old, str(new)), fields)


DISCRETE = ["x", "v", "a", "c", "tau", "v_threshold", "v_reset", "beta", "k", "g", "ge"]
TARGETS = [
    Target("name", st.one_of(IDENTIFIERS, TEXTS, TOML_VALUES),
           _at(BASE, "name"), _exact("name")),
    Target("doc", st.one_of(TEXTS, TOML_VALUES), _at(BASE, "doc"), _exact("doc")),
    Target("charge", expressions(DISCRETE, ("decay_input",)), _at(BASE, "charge"), _exact("charge")),
    Target("threshold", expressions(DISCRETE[1:]), _at(BASE, "threshold"), _exact("threshold")),
    Target("updates.a", expressions([*DISCRETE, "h", "s"]), _at(BASE, "updates", "a"), _exact("updates.a")),
    Target("derived.ge", expressions(["g", "tau", "beta", "k", "v_threshold"]), _at(BASE, "derived", "ge"),
           _exact("derived.ge")),
    Target("ode.v", expressions(["v", "x", "w", "tau", "tau_w", "b"]), _at(ODE_BASE, "ode", "v"), _exact("ode.v")),
    Target("ode.w", expressions(["w", "v", "x", "tau_w", "b"]), _at(ODE_BASE, "ode", "w"), _exact("ode.w")),
    Target("jumps.w", expressions(["w", "h", "v", "x", "b"]), _at(ODE_BASE, "jumps", "w"), _exact("jumps.w")),
    Target("surrogate.gradient", expressions(["x", "alpha"]), _at(BASE, "surrogate", "gradient"),
           _exact("surrogate.gradient")),
    Target("reset", st.one_of(st.sampled_from(["hard", "soft", "none"]), TEXTS, TOML_VALUES), _at(BASE, "reset"),
           _exact("reset"), renders=False),
    Target("method", st.one_of(st.sampled_from(["euler", "exponential_euler", "exact"]), TEXTS, TOML_VALUES),
           _at(ODE_BASE, "method"), _exact("method"), renders=False),
    _renamed(BASE, "params", "tau"),
    _renamed(BASE, "params", "k"),
    _renamed(BASE, "states", "a"),
    _renamed(BASE, "states", "v"),
    _renamed(BASE, "derived", "ge"),
    _renamed(BASE, "options", "decay_input"),
    _renamed(BASE, "surrogate", "alpha"),
    Target("params.k.default (a constant)", st.one_of(st.floats(), st.integers(-2**63, 2**63 - 1), TOML_VALUES),
           _at(BASE, "params", "k", "default"), _exact("params.k")),
    Target("params.tau (a scalar's default)", st.one_of(st.floats(), TOML_VALUES), _at(BASE, "params", "tau"),
           _exact("params.tau")),
    Target("params.beta.kind", st.one_of(st.sampled_from(["constant", "scalar", "tensor"]), TEXTS, TOML_VALUES),
           _at(BASE, "params", "beta", "kind"), _exact("params.beta.kind"), renders=False),
    Target("params.g.learnable", TOML_VALUES, _at(BASE, "params", "g", "learnable"),
           _exact("params.g.learnable", "params.g.kind"), renders=False),
    Target("params.beta.doc", st.one_of(TEXTS, TOML_VALUES), _at(BASE, "params", "beta", "doc"),
           _exact("params.beta.doc")),
    Target("params.beta (other keys)", st.dictionaries(st.text(max_size=8), TOML_VALUES, max_size=3).map(
        lambda extra: {"default": 0.2, **extra}), _at(BASE, "params", "beta"), _exact("params.beta")),
    Target("states.a (initial value)", st.one_of(st.sampled_from(DISCRETE), TOML_VALUES), _at(BASE, "states", "a"),
           _exact("states.a")),
    Target("options.decay_input (value)", TOML_VALUES, _at(BASE, "options", "decay_input"),
           _exact("options.decay_input"), renders=False),
    Target("surrogate (table)", st.one_of(
        st.sampled_from(["Sigmoid", "ATan", "S2NN", "PiecewiseLeakyReLU", "custom", "Foo"]).flatmap(
            lambda n: st.dictionaries(st.sampled_from(["alpha", "beta", "w", "c", "gradient", "x", "k"]),
                                      st.one_of(st.floats(), TOML_VALUES), max_size=3).map(
                lambda p: {"name": n, **p})),
        TOML_VALUES), _at(BASE, "surrogate"), _exact("surrogate")),
    Target("top-level keys", st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(
        ["nmae", "chrage", "param", "state", "update", "surogate", "ode", "jumps", "method", "origin"])),
        TOML_VALUES, min_size=1, max_size=2), lambda extra: {**_copy(BASE), **extra},
        lambda extra: (*map(str, extra), *TOML_KEYS), renders=False),
    # any TOML value in place of any top-level field (the error may surface in another field)
    Target("any top-level field, any TOML value", st.tuples(st.sampled_from(TOML_KEYS[:11]), TOML_VALUES),
        lambda kv: _set(BASE, (kv[0],), kv[1]), lambda _: TOML_KEYS,
        renders=False),
]


DIRECTIVES = {"#pragma unroll", "#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
              # the group sums' helper (group_sum.cu.j2): a kernel with a learnable shared parameter carries it
              "#ifndef AC_GROUP_SUM", "#define AC_GROUP_SUM", "#if defined(__CUDA_ARCH__)", "#else", "#endif",
              # the NaN-keeping min and max (`dtypes.NAN_FOLDS`): a kernel whose spec takes a min or max carries them
              "#ifndef AC_NAN_FOLDS", "#define AC_NAN_FOLDS"}
CODE_FORBIDDEN = re.compile(r"/\*|\*/|\\|'|\?\?|`|\$|@|\b(asm|__asm__|volatile|goto|__import__|printf|malloc)\b")


def assert_safe_source(source: str) -> None:
    """Nothing of a spec's raw text outside sanitised `//` comments: printable ASCII only, only the templates'
    directives, no block comments, string or character literals, line continuations or dangerous names."""
    assert source.isascii(), "non-ASCII character in the generated source"
    for number, line in enumerate(source.splitlines(), 1):
        assert all(" " <= c <= "~" for c in line), f"line {number}: control character: {line!r}"
        code, _, comment = line.partition("//")
        if code.strip().startswith("#"):
            assert code.strip() in DIRECTIVES and not comment, f"line {number}: unexpected directive {line!r}"
            continue
        assert "#" not in code, f"line {number}: {line!r}"
        code = code.replace('extern "C"', "extern C")
        assert '"' not in code, f"line {number}: string literal: {line!r}"
        found = CODE_FORBIDDEN.search(code)
        assert found is None, f"line {number}: {found.group()!r} in code: {line!r}"
        assert "\\" not in comment and "*/" not in comment, f"line {number}: comment escapes: {line!r}"


def render(spec: NeuronSpec, every: bool = False) -> list[str]:
    """The float16 backward (it recomputes the forward step); `every`: also the float32 forward, plain and in a
    vector layout, and the float64 single-step backward."""
    kernels = [spec.source("bptt", "float16")]
    if every:
        kernels += [spec.source("fptt", "float32", lanes=4, vector=True), spec.source("fptt", "float32"),
                    spec.source("step-backward", "float64")]
    return kernels


def _danger(value: object) -> int:
    return sum(d in str(value) for d in DANGEROUS)


ACCEPTED: dict[str, list[str]] = {}   # target -> kernel sources of accepted specs (compiled by the nvcc test)
_KEYS_HINT = f" (allowed: {', '.join(TOML_KEYS)})"


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_fuzzed_spec_field_is_refused_by_name_or_safe(target: Target):
    accepted: list[tuple[object, NeuronSpec]] = []
    count = [0]

    @fixed_seed(zlib.crc32(target.name.encode()))
    @settings(FUZZ, max_examples=target.examples)
    @given(value=target.values)
    def run(value):
        count[0] += 1
        try:
            spec = spec_from_toml(to_toml(target.build(value)), source="fuzz.toml")
        except SpecError as error:
            if not error.field:  # an empty top-level key: the message quotes it
                assert str(error) == f"fuzz.toml: unknown key ''{_KEYS_HINT}", str(error)
                return
            assert error.source == "fuzz.toml", str(error)
            assert str(error).startswith(f"fuzz.toml: field '{error.field}': "), str(error)
            allowed = target.fields(value)
            assert any(error.field == f or error.field.startswith(f + ".") for f in allowed), (
                f"{target.name}: the error names field {error.field!r}, expected one of {allowed}: {error}")
            return
        accepted.append((value, spec))

    run()
    print(f"{target.name}: {count[0]} examples, {len(accepted)} accepted")
    assert count[0] >= target.examples // 2  # (hypothesis stops early only when it has seen every value)
    if not target.renders:
        return
    sources: list[str] = []
    for _, spec in sorted(accepted, key=lambda a: -_danger(a[0])):  # the most hostile accepted values first
        try:
            kernels = render(spec)
        except SpecError as error:  # a constant that does not fit the kernel's arithmetic type, named
            assert error.field.startswith(("params", "surrogate")) and "constant" in error.message, str(error)
            continue
        for source in kernels:
            assert_safe_source(source)
        sources += kernels
        if len(sources) >= RENDER_PER_FIELD:
            break
    ACCEPTED[target.name] = sources


NASTY_BUT_VALID = [  # accepted specs with the most hostile text that may reach the source
    {**_copy(BASE), "name": "asm_if", "doc": "*/ #include <stdio.h>\n#define x 1 \\\n ??/ \x00 \u00e9 /* // `$@"},
    _set(_rename(_rename(_rename(BASE, "params", "tau", "threadIdx_"), "states", "a", "asmx"), "states", "c",
                 "define"), ("params", "beta", "doc"), '*/ asm("trap;") /*'),
    _rename(_rename(BASE, "derived", "ge", "main"), "params", "k", "nan"),
    _set(BASE, ("charge",), "(" * 60 + "v + x / tau" + ")" * 60 + " + k * c"),
    _set(BASE, ("charge",), "v + x * 1e30 / 1e30 + 1e-30 * c + 0x7fffffff * 1e-12 * k"),
    _set(BASE, ("updates", "a"), "exp(" * 20 + "a * 1e-3" + ")" * 20 + " + s * ge - 1"),
    _set(BASE, ("surrogate", "gradient"), "heaviside(x) * min(alpha, 1 / abs(x)) + max(x, 0)"),
    _set(ODE_BASE, ("method",), "exact"),
]


def test_accepted_specs_compile_with_nvcc(nvcc):
    """The hostile-but-valid specs above and the accepted fuzzed specs the tests above rendered compile with nvcc
    (a few nvcc calls in parallel, many kernels each: nvcc takes a second or more per call). By default to PTX: what
    a spec's text can break, the front end decides (no name or text of the spec's reaches ptxas: see nvcc_check and
    test_security_names), and ptxas's verdict on the kernels' shapes is test_neuron_compile's; assembled with
    --slow."""
    hostile = []
    for data in NASTY_BUT_VALID:
        for source in render(spec_from_toml(to_toml(data), source="nasty.toml"), every=True):
            assert_safe_source(source)
            hostile.append(source)
    # a number below float32's smallest (a subnormal double) reaches the float64 kernels alone: float32 would read 0
    tiny = spec_from_toml(to_toml(_set(BASE, ("charge",), "v + x + 1e-320 * c")), source="nasty.toml")
    hostile += [tiny.source("step-backward", "float64"), tiny.source("bptt", "float64")]
    with pytest.raises(ConstantRangeError, match="1e-320 is below the smallest float32"):
        tiny.source("bptt", "float16")
    fuzzed = [s for group in ACCEPTED.values() for s in group]
    kernels = {re.search(r"__global__ void (\w+)\(", k).group(1): k for k in hostile + fuzzed}  # one per name
    print(f"nvcc: {len(hostile)} kernels of hostile specs, {len(fuzzed)} of fuzzed ones ({len(ACCEPTED)} fields)")
    names = list(kernels)
    jobs = min(8, max(2, os.cpu_count() or 2))  # a few nvcc calls, in parallel
    batches = {f"batch {i}": "\n".join(kernels[n] for n in names[i::jobs]) for i in range(min(jobs, len(names)))}
    assemble = profile() == "slow"
    failed = nvcc(batches, archs=("sm_80",), assemble=assemble)
    if failed:  # compile the failed batches' kernels one by one to name the one at fault
        culprits = nvcc({n: kernels[n] for label in failed for n in names[int(label.split()[1])::jobs]},
                        archs=("sm_80",), assemble=assemble)
        pytest.fail("\n\n".join(culprits.values()) or "\n\n".join(failed.values()))


def test_safety_check_is_not_vacuous():
    source = "\n".join(render(spec_from_toml(to_toml(BASE))))
    assert_safe_source(source)
    assert "#pragma unroll" in source and "// fuzz: fuzzing base" in source
    for bad in ["#include <stdio.h>", "int y; /* x */", 'asm("trap;");', "y = 1; \\", "// ok \\", "// */",
                "float \u00e9;", "char c = 'a';", "#pragma unroll // x"]:
        with pytest.raises(AssertionError):
            assert_safe_source(source + "\n" + bad)


@pytest.mark.parametrize(("group", "name"), [("params", "x_seq"), ("states", "spike_seq"), ("params", "v_init"),
                                             ("params", "grad_g"), ("params", "uint4"), ("states", "uint2")])
def test_spec_names_never_collide_with_generated_names(group, name):
    """Refused, or the kernels compile. (Found here: names of generated kernel parameters and vector word types
    passed the identifier check, then the kernels did not compile.)"""
    old = {"params": "beta", "states": "c"}[group]
    try:
        spec = spec_from_toml(to_toml(_rename(BASE, group, old, name)))
    except SpecError as error:  # refusing the name is a fix too
        assert name in str(error)
        return
    try:
        nvcc_path()
    except RuntimeError as error:
        pytest.skip(str(error))
    kernels = [spec.source(k, "float32") for k in ("fptt", "bptt")] + [
        spec.source("fptt", "float16", lanes=8, vector=True)]
    nvcc_check("\n".join(kernels), archs=("sm_80",), optimise=False)


@pytest.mark.parametrize("table", ["params", "states", "updates", "derived", "options", "ode", "jumps"])
def test_tables_as_pairs_with_unhashable_names_are_spec_errors(table):
    """(Found here: an array or a table as a name raised TypeError: unhashable type.)"""
    base = ODE_BASE if table in ("ode", "jumps") else BASE
    value = {"params": 1.0, "states": 0.0, "options": True}.get(table, "x")  # valid but for the name
    with pytest.raises(SpecError, match=rf"^fuzz.toml: field '{table}"):
        spec_from_toml(to_toml(_set(base, (table,), [[[], value]])), source="fuzz.toml")


@pytest.mark.parametrize("name", ["lif_", "a__b", "ac_x", "A" * 32])
def test_spec_names_make_valid_kernel_names(name):
    """(Found here: such names were accepted, then making a kernel raised a ValueError naming no field.)"""
    try:
        spec = spec_from_toml(to_toml({**_copy(BASE), "name": name}), source="fuzz.toml")
    except SpecError as error:  # refusing the name is a fix too
        assert error.field == "name"
        return
    for kernel, dtype in (("fptt", "float32"), ("step-backward", "bfloat16")):
        assert_safe_source(spec.source(kernel, dtype, detach_reset=True))


def test_constants_out_of_float32_range_are_refused_by_name():
    """A float64 kernel may hold a constant a float32 one cannot: refused when that kernel is made, by field.
    (Found here: a ValueError that named no field.)"""
    spec = spec_from_toml(to_toml(_set(BASE, ("params", "k", "default"), 1e300)), source="fuzz.toml")
    assert_safe_source(spec.source("fptt", "float64"))
    with pytest.raises(SpecError, match=r"^fuzz.toml: field 'params.k'"):
        spec.source("fptt", "float32")
    spec = spec_from_toml(to_toml(_set(BASE, ("surrogate",), {"name": "Sigmoid", "alpha": 1e300})))
    with pytest.raises(SpecError, match=r"field 'surrogate.alpha'"):
        spec.source("bptt", "float16")


# =====================================================================================================================
# 3. The host runner's disk cache under faults
# =====================================================================================================================
# Workers import autocuda.toolchain.host without the package's __init__ (torch and sympy: seconds per process): the
# cache, the runner and the toolchain need NumPy only, so 8 processes start in a fraction of a second each. Imported
# into this process (the package already loaded), the same module gives the tests the worker's kernels.
WORKER = textwrap.dedent("""
    import dataclasses, importlib.util, json, sys, time, types, warnings
    from pathlib import Path
    import numpy as np
    if "autocuda" not in sys.modules:
        package = types.ModuleType("autocuda")
        package.__path__ = list(importlib.util.find_spec("autocuda").submodule_search_locations)
        sys.modules["autocuda"] = package
    import autocuda.toolchain.host as host

    # HOST_PARAM_CLASS

    PARAMS = (Param("x", "float", True, True), Param("y", "float", True, False),
              Param("n", "unsigned int", False, True))

    def source(name, factor):
        return ('extern "C" __global__ void ' + name + '(const float* x, float* y, const unsigned int n) {\\n'
                '    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\\n'
                '    if (i < n) y[i] = ' + repr(float(factor)) + 'f * x[i] + 1.0f;\\n}\\n')

    def run(name, factor):
        x = np.arange(37, dtype=np.float32)
        y = np.zeros_like(x)
        args = [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data), np.uint32(x.size)]
        host.launch(source(name, factor), name, PARAMS, (2,), (32,), args)
        assert np.array_equal(y, np.float32(factor) * x + 1), (name, y)

    if __name__ == "__main__":  # worker.py KERNELS_JSON [READY_FILE GO_FILE]
        kernels = json.loads(sys.argv[1])
        if len(sys.argv) > 2:  # wait for the others: all start compiling at once
            Path(sys.argv[2]).touch()
            while not Path(sys.argv[3]).exists():
                time.sleep(0.005)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, factor in kernels:
                run(name, factor)
        print(json.dumps({"stats": dict(host.stats), "warnings": [str(w.message) for w in caught]}))
""").replace("# HOST_PARAM_CLASS\n", HOST_PARAM_CLASS)


def _worker_module(tmp_path: Path):
    """The worker script's path, and its module imported here (its `run` uses this process's host runner)."""
    path = tmp_path / "cache_worker.py"
    path.write_text(WORKER)
    spec = importlib.util.spec_from_file_location(f"cache_worker_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def _worker_env(cache_root: Path) -> dict[str, str]:
    return os.environ | {"AUTOCUDA_CACHE_DIR": str(cache_root), "PYTHONPATH": str(REPO)}


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.so"))


def _flip_bit(path: Path, offset: int | None = None, bit: int = 0) -> None:
    """Flip one bit of the file on disk. Written as a new file moved into place: rewriting the file in place
    would also corrupt the copy this process may have mapped (loaded), and crash it."""
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 1 << bit
    temporary = path.with_name(path.name + ".flipped")
    temporary.write_bytes(bytes(data))
    os.replace(temporary, path)


@pytest.fixture(scope="module")
def shim_folder(tmp_path_factory) -> list[Path]:
    """The host runner's precompiled shims (with and without the half-precision headers: folders of the cache),
    built once for the file and copied by `with_shim` into the fresh cache folders of the tests below: what they
    test is the kernels' entries, and building the shims again in each folder costs a second of CPU."""
    root = tmp_path_factory.mktemp("shim-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOCUDA_CACHE_DIR", str(root))
        for shim in (host_runner.SHIM, host_runner.SHIM_PLAIN):
            host_runner._shim_header(shim)
    folders = sorted((root / "host").glob("shim-*"))
    assert len(folders) == 2
    return folders


def with_shim(cache_root: Path, shims: list[Path]) -> None:
    """`cache_root` holding the precompiled shims (as a cache a process has compiled into before)."""
    for shim in shims:
        shutil.copytree(shim, cache_root / "host" / shim.name, dirs_exist_ok=True)


# Processes in the race below: the count is not the point, the race is (four race as eight do).
RACERS = 8 if profile() == "slow" else 4


@needs_host
def test_eight_processes_compiling_at_once_leave_a_valid_cache(tmp_path, monkeypatch, shim_folder):
    """Racing processes, half of them asking for the shared kernel first and half last, over a folder with a
    corrupt entry and a stale temporary file: eight with --slow, by default four (`RACERS`), which race alike: two
    in each order on the shared entry, each with a kernel of its own."""
    cache_root = tmp_path / "cache"
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(cache_root))
    with_shim(cache_root, shim_folder)
    worker, here = _worker_module(tmp_path)
    shared = [["rel_shared", 2.0]]
    # Faults already in the folder: a bit-flipped entry of a kernel every worker needs, a writer's stale temp file.
    here.run(*shared[0])
    (entry,) = _entries(cache_root / "host")
    _flip_bit(entry)
    corrupt = entry.read_bytes()
    stale = entry.parent / f".{entry.name}.stale1234"
    stale.write_bytes(b"half-written by a killed process")
    go = tmp_path / "go"
    env = _worker_env(cache_root)
    procs = []
    for i in range(RACERS):  # every worker: the shared kernel and one of its own (half of them in the other order)
        kernels = shared + [[f"rel_own_{i}", 10.0 + i]] if i % 2 else [[f"rel_own_{i}", 10.0 + i]] + shared
        procs.append(subprocess.Popen([sys.executable, str(worker), json.dumps(kernels),
                                       str(tmp_path / f"ready{i}"), str(go)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(RACERS)) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    obtained = sum(sum(r["stats"].values()) for r in reports)
    assert obtained == RACERS * 2 and all(not r["warnings"] for r in reports)
    # Afterwards: one library and one matching checksum per kernel, nothing half-written beside them.
    folder = cache_root / "host"
    libraries = _entries(folder)
    assert len(libraries) == 1 + RACERS
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == [stale.name]
    for library in libraries:
        assert host_cache._verified(library), f"{library.name} does not match its checksum"
        assert library.with_name(library.name + ".sha256").read_text().strip() == \
            hashlib.sha256(library.read_bytes()).hexdigest()
    assert entry.read_bytes() != corrupt  # the bit-flipped entry was rebuilt
    names = {f"rel_own_{i}" for i in range(RACERS)} | {n for n, _ in shared}
    for library in libraries:  # every entry loads and holds one of the kernels
        loaded = ctypes.CDLL(str(library))
        assert sum(hasattr(loaded, f"{n}__host_launch") for n in names) == 1
    before = dict(host_runner.stats)
    for i in range(RACERS):
        here.run(f"rel_own_{i}", 10.0 + i)  # from disk in this process, with correct results
    assert host_runner.stats["disk"] - before.get("disk", 0) == RACERS
    assert host_runner.stats["compiled"] == before.get("compiled", 0)


def _build_counting(calls: list) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        calls.append(path)
        path.write_bytes(b"\x7fELF library bytes " + bytes(range(256)))
    return build


def _sidecar(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


FAULTS: dict[str, Callable[[Path], None]] = {
    "bit flip in the library": lambda lib: _flip_bit(lib, bit=3),
    "library truncated": lambda lib: lib.write_bytes(lib.read_bytes()[:7]),
    "library emptied": lambda lib: lib.write_bytes(b""),
    "bytes appended to the library": lambda lib: lib.write_bytes(lib.read_bytes() + b"\0"),
    "library deleted, checksum left": lambda lib: lib.unlink(),
    "checksum deleted": lambda lib: _sidecar(lib).unlink(),
    "checksum emptied": lambda lib: _sidecar(lib).write_text(""),
    "checksum of other bytes": lambda lib: _sidecar(lib).write_text(hashlib.sha256(b"other").hexdigest()),
    "checksum low bit flipped": lambda lib: _flip_bit(_sidecar(lib), 5, bit=0),
    # (found here: a checksum that is not UTF-8 raised UnicodeDecodeError on every load instead of a rebuild)
    "checksum high bit flipped (not UTF-8)": lambda lib: _flip_bit(_sidecar(lib), 5, bit=7),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_entry_is_detected_and_rebuilt(fault, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    calls: list = []
    build = _build_counting(calls)
    library, cached = host_cache.load_or_build("k" * 64, build)
    assert not cached and len(calls) == 1
    good = library.read_bytes()
    assert host_cache.load_or_build("k" * 64, build) == (library, True) and len(calls) == 1
    FAULTS[fault](library)
    path, cached = host_cache.load_or_build("k" * 64, build)
    assert (path, cached) == (library, False) and len(calls) == 2, "the damaged entry was used"
    assert library.read_bytes() == good and host_cache._verified(library)
    assert host_cache.load_or_build("k" * 64, build) == (library, True) and len(calls) == 2


@needs_host
def test_bit_flipped_kernel_library_is_rebuilt_in_process(tmp_path, monkeypatch, shim_folder):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    with_shim(tmp_path, shim_folder)
    _, here = _worker_module(tmp_path)
    here.run("rel_flip", 5.0)
    (library,) = _entries(tmp_path / "host")
    _flip_bit(library, bit=6)
    for key in [k for k, v in host_runner._loaded.items() if v.path == library]:  # as in a fresh process
        del host_runner._loaded[key]
    before = host_runner.stats["compiled"]
    here.run("rel_flip", 5.0)
    assert host_runner.stats["compiled"] == before + 1 and host_cache._verified(library)


def _drop_file_capabilities() -> None:
    """In the child, before exec: as root, give up the capabilities that ignore file permissions (prctl
    PR_CAPBSET_DROP of CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), so a mode-555 folder is read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


READ_ONLY_PROBE = "import tempfile, sys; tempfile.NamedTemporaryFile(dir=sys.argv[1]); print('writable')"


@needs_host
@pytest.mark.parametrize("state", ["cold", "warm", "no host folder"])
def test_read_only_cache_folder_still_works_with_one_warning(state, tmp_path, monkeypatch, shim_folder):
    root = tmp_path / "cache"
    (root / "host").mkdir(parents=True)
    worker, here = _worker_module(tmp_path)
    kernels = [["rel_ro_a", 6.0], ["rel_ro_b", 7.0]]  # two compiles, one warning
    if state == "warm":
        with_shim(root, shim_folder)
        monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(root))
        for kernel in kernels:
            here.run(*kernel)
    if state == "no host folder":
        (root / "host").rmdir()
    listing = sorted((p.name, p.stat().st_size) for p in root.rglob("*"))
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    env = _worker_env(root)
    preexec = _drop_file_capabilities if os.geteuid() == 0 else None
    try:
        probe = subprocess.run([sys.executable, "-c", READ_ONLY_PROBE, str(root)], env=env, capture_output=True,
                               text=True, preexec_fn=preexec)
        if probe.returncode == 0:
            pytest.skip("cannot make a read-only folder here (file permissions are not enforced for this user)")
        done = subprocess.run([sys.executable, str(worker), json.dumps(kernels)], env=env,
                              capture_output=True, text=True, preexec_fn=preexec)
    finally:
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["warnings"]) == 1 and "not writable" in report["warnings"][0], report
    assert sum(report["stats"].values()) == 2  # both kernels ran (their results are checked in the worker)
    assert sorted((p.name, p.stat().st_size) for p in root.rglob("*")) == listing  # nothing written there


# =====================================================================================================================
# 4. Determinism of the host runner
# =====================================================================================================================
def _training_step(name: str, dtype: torch.dtype, backend: str) -> list[torch.Tensor]:
    """Outputs and every gradient (input, initial states, learnable per-channel parameters) of one step."""
    x = (seq(6, 2, 3, 5, dtype=dtype, seed=30) * 2).requires_grad_()
    compute = F32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if name == "parametric_lif":
        params = {"w": torch.tensor([[0.3], [-0.4], [1.1]], dtype=compute, requires_grad=True)}  # [C, 1] of [B, C, W]
    else:  # alif: tau per channel, learned although the spec calls it a scalar
        params = {"tau": torch.tensor([[2.0], [3.5], [5.0]], dtype=compute, requires_grad=True)}
    states = [seq(2, 3, 5, dtype=dtype, seed=31 + i).requires_grad_() for i in range(1 if name != "alif" else 2)]
    spikes, finals, seqs = F.multi_step(name, x, *states, store_state_seq=True, backend=backend, **params)
    outputs = [spikes, *finals, *seqs]
    loss = sum((o.to(F64) * seq(*o.shape, dtype=F64, seed=40 + i)).sum() for i, o in enumerate(outputs))
    grads = torch.autograd.grad(loss, [x, *states, *params.values()])
    assert grads[-1].abs().sum() > 0 and spikes.sum() > 0
    return [o.detach() for o in outputs] + list(grads)


REPRODUCED = [("parametric_lif", F32), ("parametric_lif", torch.float16), ("alif", F32)]


@needs_host
@pytest.mark.parametrize(("name", "dtype"), REPRODUCED, ids=str)
def test_host_runs_are_bitwise_reproducible(name, dtype):
    first, second = _training_step(name, dtype, "host"), _training_step(name, dtype, "host")
    for i, (a, b) in enumerate(zip(first, second)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output/gradient {i} differs between two runs"
    reference = _training_step(name, dtype, "reference")
    torch.testing.assert_close(first[-1], reference[-1], rtol=2e-3, atol=2e-3)  # and they are the right gradients


def test_reference_runs_are_bitwise_reproducible():
    first, second = _training_step("parametric_lif", F32, "reference"), _training_step("parametric_lif", F32,
                                                                                           "reference")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


if __name__ == "__main__":  # pragma: no cover - run the fuzzing alone and print the counts
    sys.exit(pytest.main([__file__, "-q", "-s", "-k", "fuzz"]))

