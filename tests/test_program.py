"""Programs (`autocuda.call.program`): a multi_step call like an earlier one runs the program built for that one (its
bound launch, for calls whose states are numbers and whose tensor parameters hold one value each). On the host
runner: every program's call equals the unbound path's bitwise (outputs and gradients), repeats build no program,
and bad input is still refused by name on a known key."""
from __future__ import annotations

import functools
import itertools
import os

import pytest
import torch
from conftest import compile_launched, profile

from autocuda.call import functional as F
from autocuda.call import program
from autocuda.spec.load import _shipped

HOST = {"backend": "host"}


def run(name, x, *states, grad=True, **kwargs):
    """multi_step's outputs, and where x requires grad the gradients of a weighted sum of them w.r.t. x."""
    spikes, finals, seqs = F.multi_step(name, x, *states, **HOST, **kwargs)
    outs = [spikes, *(finals or ()), *(seqs or ())]
    if not (grad and x.requires_grad):
        return outs
    weights = [torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).view(o.shape) for o in outs]
    loss = sum((o * w).sum() for o, w in zip(outs, weights))
    return [*outs, *torch.autograd.grad(loss, x)]


def both(monkeypatch, name, make_x, *states, **kwargs):
    """(the second call's results, through its program's bound launch; the unbound path's), each from a fresh x."""
    run(name, make_x(), *states, **kwargs)  # builds and binds the program
    got = run(name, make_x(), *states, **kwargs)
    monkeypatch.setattr(program, "ENABLED", False)
    want = run(name, make_x(), *states, **kwargs)
    monkeypatch.setattr(program, "ENABLED", True)
    return got, want


CASES = [
    ("lif", (), {"tau": 2.0}),
    ("lif", (0.25,), {"tau": 3, "v_reset": None}),  # an int parameter, a soft reset, a given initial state
    ("lif", (), {"tau": 2.0, "store_state_seq": True}),
    ("lif", (), {"tau": 2.0, "final_states": False}),
    ("lif", (), {"tau": 2.0, "save_h": False}),
    ("izhikevich", (), {}),
    ("izhikevich", (-0.5, 1), {"store_state_seq": True}),
    ("alif", (), {"detach_reset": True}),
    ("lif", (), {"tau": 2.0, "surrogate": "atan", "reset": "soft"}),
    # tensor parameters of one value each (bound too): a 0-d one, and a [1] one that needs a gradient
    ("lif", (), {"tau": torch.tensor(2.0), "v_threshold": torch.tensor([0.75], requires_grad=True)}),
]


DTYPES = [torch.float64, torch.float32, torch.bfloat16]
SHAPES = [(5, 12), (9, 2, 3)]


TRAIN = [False, True]
FULL = [(case, train, shape, dtype) for case in range(len(CASES)) for train in TRAIN for shape in SHAPES
        for dtype in DTYPES]


def default_runs() -> list[tuple[int, bool, tuple[int, ...], torch.dtype]]:
    """The default profile's calls: every case in every dtype, inference and training, the shape taken in turn, so
    that every pair of case, grad mode, shape and dtype of the full product (--slow) is checked. (Each shape has its
    own T, and a T below 8 compiles kernels replaying T steps: a kernel set per T.)"""
    return [(case, train, SHAPES[(case + i + j) % 2], dtype) for case in range(len(CASES))
            for i, train in enumerate(TRAIN) for j, dtype in enumerate(DTYPES)]


RUNS = FULL if profile() == "slow" else default_runs()


def test_the_default_runs_hold_every_pair_of_the_full_product():
    default = default_runs()
    assert set(default) <= set(FULL)
    for a, b in itertools.combinations(range(4), 2):
        assert {(k[a], k[b]) for k in FULL} == {(k[a], k[b]) for k in default}, (a, b)


def _input(shape, dtype, train):
    x = (torch.rand(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2).to(dtype)
    return x.requires_grad_(train)


@pytest.fixture(scope="module")
def compiled_kernels() -> int:
    """The kernels test_bound_calls_equal_the_unbound_path launches, compiled up front many to a compiler run
    (`conftest.compile_launched`); the unbound path launches what the bound one does."""
    def unbound(case, train, shape, dtype):
        name, states, kwargs = CASES[case]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(program, "ENABLED", False)
            run(name, _input(shape, dtype, train), *states, **kwargs)
    return compile_launched(*(functools.partial(unbound, case, train, shape, dtype)
                              for case, train, shape, dtype in RUNS))


def _run_id(value) -> str:
    if isinstance(value, bool):
        return "training" if value else "inference"
    if isinstance(value, tuple):
        return "rows" if value == SHAPES[0] else "view"
    return str(value)


@pytest.mark.parametrize(("case", "train", "shape", "dtype"), RUNS, ids=_run_id)
def test_bound_calls_equal_the_unbound_path(case, train, shape, dtype, monkeypatch, compiled_kernels):
    """With --slow every case x grad mode x shape x dtype; by default a covering set (`default_runs`)."""
    name, states, kwargs = CASES[case]
    got, want = both(monkeypatch, name, functools.partial(_input, shape, dtype, train), *states, **kwargs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)


def test_repeated_calls_build_no_program_and_numbers_still_change(monkeypatch):
    x = torch.rand(4, 10, dtype=torch.float64) * 2
    F.multi_step("lif", x, 0.5, tau=2.0, **HOST)
    built, calls = [], []
    original = program.Program.__init__
    monkeypatch.setattr(program.Program, "__init__",
                        lambda self, *a, **k: (built.append(a), original(self, *a, **k))[1])
    call = program.Call.__init__
    monkeypatch.setattr(program.Call, "__init__", lambda self, *a, **k: (calls.append(a), call(self, *a, **k))[1])
    for tau in (2.0, 5.0):
        spikes, (v,), _ = F.multi_step("lif", x, 0.5, tau=tau, **HOST)
        monkeypatch.setattr(program, "ENABLED", False)
        want_spikes, (want_v,), _ = F.multi_step("lif", x, 0.5, tau=tau, **HOST)
        monkeypatch.setattr(program, "ENABLED", True)
        assert torch.equal(spikes, want_spikes) and torch.equal(v, want_v), tau
    assert built == [], "a number's value is no part of the key: every call ran the first call's program"
    assert len(calls) == 2, "the bound program ran at once (`Program.run_bound`); only the unbound calls built a Call"
    assert F.multi_step("lif", x, 0.5, tau=2, **HOST)[0].shape == x.shape and len(built) == 1, "an int: a new key"


def test_one_value_tensor_parameters_run_the_bound_launch_and_are_read_at_each_call(monkeypatch):
    """A call whose tensor parameters hold one value each runs its program's bound launch, which reads them at
    every call (a value changed in place counts); a parameter of another alignment is another key."""
    x = torch.rand(4, 10, dtype=torch.float64) * 2
    wants = [F.multi_step("lif", x, tau=value, **HOST) for value in (2.0, 5.0)]
    tau = torch.tensor([0.0, 2.0], dtype=torch.float64)[1:]  # [1], 8 bytes past its allocation's start
    program.PROGRAMS.clear()  # (a cache: the programs below are this test's)
    F.multi_step("lif", x, tau=tau, **HOST)
    owned = [p for p in program.PROGRAMS.values() if p.tensors]
    assert owned and all(p.launch is not None and p.bindable for p in owned), "bound with its tensor parameter"
    calls = []
    call = program.Call.__init__
    monkeypatch.setattr(program.Call, "__init__", lambda self, *a, **k: (calls.append(a), call(self, *a, **k))[1])
    for value, (want_spikes, (want_v,), _) in zip((2.0, 5.0), wants):
        tau.fill_(value)
        spikes, (v,), _ = F.multi_step("lif", x, tau=tau, **HOST)
        assert torch.equal(spikes, want_spikes) and torch.equal(v, want_v), value
    assert calls == [], "the bound program ran at once (`Program.run_bound`)"
    aligned = torch.tensor([5.0], dtype=torch.float64)
    assert torch.equal(F.multi_step("lif", x, tau=aligned, **HOST)[0], wants[1][0]) and len(calls) == 1, \
        "another alignment: another key (the launch was bound to the layout the first call's tensors allow)"


def test_kept_tensor_parameters_see_every_change():
    """A layer's bound program keeps its call's tensor parameters as the kernels take them (`Program.kept_tensor_args`)
    only where they are views of the given tensors: a change through `.data` (which counts no version) and a new
    `.data` take effect; a parameter converted to the compute dtype (a copy) is converted again at each call.
    Functional calls' programs (`PROGRAMS`) keep none: they would keep the caller's tensors alive."""
    x = torch.rand(4, 10, dtype=torch.float64) * 2
    wants = {value: F.multi_step("lif", x, tau=value, **HOST)[0] for value in (2.0, 5.0)}
    for dtype, kept in ((torch.float64, True), (torch.float32, False)):
        owned = program.Programs()  # a layer's

        def call(tau, owned=owned):
            return F.run_sequence(owned, "lif", x, (), None, False, None, False, True, "host", True, {"tau": tau})[0][0]
        tau = torch.tensor([2.0], dtype=dtype)
        for _ in range(2):  # the second call runs the bound program
            assert torch.equal(call(tau), wants[2.0])
            assert torch.equal(F.multi_step("lif", x, tau=tau, **HOST)[0], wants[2.0])
        assert len(owned) == 1 and (next(iter(owned.values())).kept_tensors is not None) == kept, dtype
        assert all(p.kept_tensors is None for p in program.PROGRAMS.values())
        tau.data.fill_(5.0)
        assert torch.equal(call(tau), wants[5.0]), (dtype, "changed through .data")
        tau.data = torch.tensor([2.0], dtype=dtype)
        assert torch.equal(call(tau), wants[2.0]), (dtype, "a new .data")


def test_keys_tell_apart_what_the_full_path_decides():
    """Grad mode, requires_grad, dtype, shape and options each select their own program."""
    x = torch.rand(4, 10, dtype=torch.float64) * 2
    F.multi_step("lif", x, **HOST)
    with torch.no_grad():
        assert F.multi_step("lif", x.clone().requires_grad_(), **HOST)[0].grad_fn is None
    assert F.multi_step("lif", x.clone().requires_grad_(), **HOST)[0].grad_fn is not None
    assert F.multi_step("lif", x.float(), **HOST)[0].dtype == torch.float32
    assert F.multi_step("lif", x[:3], **HOST)[0].shape == (3, 10)
    spikes, finals, seqs = F.multi_step("lif", x, **HOST, final_states=False, store_state_seq=True)
    assert finals is None and seqs[0].shape == (4, 10)


def test_bad_input_on_a_known_key_is_refused_by_name():
    x = torch.rand(4, 10, dtype=torch.float64) * 2
    for _ in range(2):
        F.multi_step("lif", x, 0.0, tau=2.0, **HOST)
    with pytest.raises(ValueError, match="tau"):
        F.multi_step("lif", x, 0.0, tau=-1.0, **HOST)
    with pytest.raises(TypeError, match="tau"):
        F.multi_step("lif", x, 0.0, tau=True, **HOST)
    with pytest.raises(TypeError, match="state 'v'"):
        F.multi_step("lif", x, True, tau=2.0, **HOST)
    with pytest.raises(TypeError, match="1 states"):
        F.multi_step("lif", x, 0.0, 0.0, tau=2.0, **HOST)
    with pytest.raises(TypeError, match="save_h"):
        F.multi_step("lif", x, 0.0, tau=2.0, save_h=1, **HOST)


def test_calls_whose_program_binds_nothing_take_the_unbound_path(tmp_path, monkeypatch):
    """Tensor parameters and states, views that are not contiguous (which run on a contiguous view where one
    exists), empty sequences, the reference backend and spec files: their programs bind no launch, and give the
    unbound path's results."""
    x = torch.rand(4, 6, dtype=torch.float64) * 2
    cases = [
        lambda: F.multi_step("parametric_lif", x, **HOST),  # a tensor parameter at its default
        lambda: F.multi_step("lif", x, torch.zeros(6, dtype=torch.float64), **HOST),
        lambda: F.multi_step("lif", x.t().contiguous().t(), **HOST),
        lambda: F.multi_step("lif", x[:0], **HOST),
        lambda: F.multi_step("lif", x, backend="reference"),
        lambda: F.multi_step("lif", x, tau=torch.tensor(2.0, dtype=torch.float64), **HOST),
    ]
    for make in cases:
        program.PROGRAMS.clear()
        got = [make() for _ in range(2)][1]
        monkeypatch.setattr(program, "ENABLED", False)
        want = make()
        monkeypatch.setattr(program, "ENABLED", True)
        assert torch.equal(got[0], want[0])
        assert all(p.launch is None or key[5] for key, p in program.PROGRAMS.items())  # x contiguous (`program_key`)
    text = _shipped()["lif"].read_text()
    spec = tmp_path / "lif.toml"
    spec.write_text(text)
    first = [F.multi_step(str(spec), x, **HOST)[0] for _ in range(2)][1]
    spec.write_text(text.replace("v_threshold = 1.0", "v_threshold = 0.01"))  # an edited file: another spec
    os.utime(spec, ns=(spec.stat().st_mtime_ns + 10**9,) * 2)
    assert F.multi_step(str(spec), x, **HOST)[0].sum() > first.sum()


def test_host_calls_take_the_python_path_and_ask_for_no_native_library(monkeypatch):
    """The native path is for CUDA calls: by default (`native.HOST` off) a bound host program, training or not,
    neither makes a native plan nor asks for the library (whose first ask starts its build), nor binds a backward
    launch beyond the one its backward runs."""
    from autocuda.call import native

    monkeypatch.setattr(native, "USE", True)
    monkeypatch.setattr(native, "HOST", False)
    asked = []
    monkeypatch.setattr(native, "loaded", lambda: asked.append(1) or True)
    program.PROGRAMS.clear()
    for grad in (False, True, True):
        x = (torch.rand(4, 40, dtype=torch.float64) * 2).requires_grad_(grad)
        spikes = F.multi_step("lif", x, **HOST)[0]
        if grad:
            spikes.sum().backward()
    made = [p for p in program.PROGRAMS.values() if p.launch is not None]
    assert made and all(p.native is None and p.backward is None for p in made) and asked == []
