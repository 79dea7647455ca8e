"""The native call path (`autocuda.native`): programs' calls through the C++ operator and its C++ autograd node give
the Python path's results bitwise (the same kernels with the same values), on the host runner here and on CUDA in
tests/gpu/test_native_gpu.py; its plans refuse malformed words; its switch and its cache."""
from __future__ import annotations

import copy
import functools
import pickle

import pytest
import python_children
import torch
from conftest import collect_everything, compile_launched, profile

from autocuda.call import functional as F
from autocuda.call import native, program
from autocuda.call.native import plan as native_plan

pytestmark = pytest.mark.usefixtures("native_on_host")  # the library is built for this file's tests (conftest)

CASES = [("lif", {"tau": 2.0}), ("izhikevich", {}), ("alif", {}), ("lif", {"tau": 2.0, "save_h": False}),
         ("qif", {}), ("lif", {"v_reset": None})]


def run(spec: str, x: torch.Tensor, train: bool, finals_in_loss: bool, **params) -> list[torch.Tensor]:
    """Spikes, final states and (training) x's gradient of a loss that weighs every step differently."""
    x = x.clone().requires_grad_(train)
    spikes, finals, _ = F.multi_step(spec, x, backend="host", **params)
    if not train:
        return [spikes, *finals]
    weights = torch.arange(1, x.shape[0] + 1, dtype=x.dtype).view(-1, *[1] * (x.dim() - 1))
    loss = (spikes * weights).sum() + (sum(f.sum() for f in finals) if finals_in_loss else 0)
    loss.backward()
    return [spikes, *finals, x.grad]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the tests below (the Python path's launches, which the native plans launch too),
    compiled up front many to a compiler run (`conftest.compile_launched`): the tests would compile them one
    kernel a run."""
    calls = [functools.partial(run, spec, torch.rand(5, 96, dtype=dtype) * 2, train, finals_in_loss, **params)
             for spec, params in CASES for dtype in (torch.float32, torch.float64)
             for train, finals_in_loss in ((False, False), (True, False), (True, True))]
    calls += [functools.partial(run, "lif", torch.rand(4, 64, dtype=dtype) * 2, True, False)
              for dtype in (torch.float32, torch.float64)]
    program.ENABLED = False  # the Python path: each call launches its kernels through autocuda.toolchain.host
    try:
        return compile_launched(*calls)
    finally:
        program.ENABLED = True


def native_plans() -> list:
    return [p.native for p in program.PROGRAMS.values()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("spec, params", CASES, ids=[f"{s}-{'-'.join(p)}" for s, p in CASES])
def test_native_calls_equal_the_python_path(spec, params, dtype, monkeypatch):
    """Inference and training, with and without the final states in the loss (two backward kernels), x [T, N] and
    x [T, 2, 48]: bitwise the Python path's spikes, final states and gradient, and a native plan ran them (made at
    a training program's first call after its first backward, which binds the backward launches). Both shapes
    have one T and N: they run the same kernels (a T below 8 compiles kernels replaying T steps, a set per T)."""
    for shape in ((5, 96), (5, 2, 48)):
        x = torch.rand(shape, dtype=dtype) * 2
        for train, finals_in_loss in ((False, False), (True, False), (True, True)):
            monkeypatch.setattr(program, "ENABLED", False)
            want = run(spec, x, train, finals_in_loss, **params)
            monkeypatch.setattr(program, "ENABLED", True)
            program.PROGRAMS.clear()
            run(spec, x, train, finals_in_loss, **params)  # builds the program (a training one binds backward)
            assert all(plan is None for plan in native_plans()) == train
            got = run(spec, x, train, finals_in_loss, **params)
            assert any(plan is not None for plan in native_plans())
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def run_steps(spec: str, x: torch.Tensor, train: bool, finals_in_loss: bool) -> list[torch.Tensor]:
    """T single steps from the spec's initial numbers (each later step starts from the last one's state tensors),
    then a multi-step call from those states: every output, and (training) the gradients of x and of the states
    the multi-step call started from, of a loss that weighs every step differently."""
    x = x.clone().requires_grad_(train)
    states: tuple = ()
    outputs = []
    for t in range(x.shape[0]):
        spike, states = F.single_step(spec, x[t], *states, backend="host")
        outputs += [spike * (t + 1), *(states if finals_in_loss else ())]
    start = tuple(s.detach().requires_grad_(train) for s in states)
    spikes, finals, _ = F.multi_step(spec, x, *start, backend="host")
    outputs += [spikes, *(finals if finals_in_loss else ())]
    if not train:
        return outputs
    grads = torch.autograd.grad(sum(o.sum() for o in outputs), (x, *start))
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.parametrize("spec", ["lif", "alif"])
def test_single_steps_and_calls_from_state_tensors_take_the_native_path(spec, monkeypatch):
    """Single steps (from numbers, then from state tensors) and a multi-step call from state tensors, in inference
    and in training (the states' gradients too, and the final states' in the loss or not): bitwise the Python
    path's, and native plans ran them, a single step's among them."""
    x = torch.rand(4, 2, 48, dtype=torch.float64) * 2
    for train, finals_in_loss in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(program, "ENABLED", False)
        want = run_steps(spec, x, train, finals_in_loss)
        monkeypatch.setattr(program, "ENABLED", True)
        program.PROGRAMS.clear()
        run_steps(spec, x, train, finals_in_loss)  # builds the programs (training ones bind backward)
        got = run_steps(spec, x, train, finals_in_loss)
        planned = [p for p in program.PROGRAMS.values() if p.native is not None]
        assert any(p.bound_form.single for p in planned) and any(p.bound_form.given_inits for p in planned)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def run_tensor_tau(x: torch.Tensor, train: bool, finals_in_loss: bool) -> list[torch.Tensor]:
    """LIF with tau a learnable tensor of one value: a multi-step call, then single steps from its final state;
    every output and (training) the gradients of x and tau."""
    x = x.clone().requires_grad_(train)
    tau = torch.tensor(2.5, dtype=x.dtype).requires_grad_(train)
    spikes, (v,), _ = F.multi_step("lif", x, backend="host", tau=tau)
    outputs = [spikes, *((v,) if finals_in_loss else ())]
    for t in range(2):
        spike, (v,) = F.single_step("lif", x[t], v, backend="host", tau=tau)
        outputs += [spike * (t + 2), *((v,) if finals_in_loss else ())]
    if not train:
        return outputs
    grads = torch.autograd.grad(sum(o.sum() for o in outputs), (x, tau))
    return [o.detach() for o in outputs] + list(grads)


def test_calls_with_a_tensor_parameter_of_one_value_take_the_native_path(monkeypatch):
    """A parameter given as a tensor of one value (here tau, learnable) is one of the native call's tensors, and its
    gradient the sum of the kernels' per-neuron partials: bitwise the Python path's, in inference and training."""
    from autocuda.runtime.neuron_launch import KernelCall

    bind = KernelCall.bind

    def checked_bind(self, args, like, n, steps, backend, *rest, **options):
        """A bound launch's arguments are filled from `args` as a call's would be (a CUDA call's layout timing runs
        them): each in the op's order, a tensor where the kernel takes one."""
        bound = bind(self, args, like, n, steps, backend, *rest, **options)
        bound.recipe.arguments(bound.binding, args, like, n, steps)
        return bound

    monkeypatch.setattr(KernelCall, "bind", checked_bind)
    x = torch.rand(4, 2, 48, dtype=torch.float64) * 2
    for train, finals_in_loss in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(program, "ENABLED", False)
        want = run_tensor_tau(x, train, finals_in_loss)
        monkeypatch.setattr(program, "ENABLED", True)
        program.PROGRAMS.clear()
        run_tensor_tau(x, train, finals_in_loss)  # builds the programs (training ones bind backward)
        got = run_tensor_tau(x, train, finals_in_loss)
        planned = [p for p in program.PROGRAMS.values() if p.native is not None]
        assert any(p.tensors for p in planned) and any(p.tensors and p.bound_form.single for p in planned)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_a_tensor_parameter_changed_in_place_takes_effect_at_the_next_native_call(monkeypatch):
    """An optimizer's step changes a learnable tensor parameter in place: the native call reads its storage at every
    call, so the next call runs with the new value (and a parameter without a gradient in a training call gets
    none)."""
    x = (torch.rand(4, 96, dtype=torch.float64) * 2).requires_grad_()
    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    program.PROGRAMS.clear()
    for _ in range(3):  # builds the program, binds backward, then plans
        F.multi_step("lif", x, backend="host", tau=tau)[0].sum().backward()
    assert any(p.native is not None and p.tensors for p in program.PROGRAMS.values())
    for value in (3.0, 1.5):
        with torch.no_grad():
            tau.fill_(value)
        got = F.multi_step("lif", x, backend="host", tau=tau)[0]
        monkeypatch.setattr(program, "ENABLED", False)
        want = F.multi_step("lif", x, backend="host", tau=value)[0]
        monkeypatch.setattr(program, "ENABLED", True)
        assert torch.equal(got, want), value
    frozen = tau.detach()  # the same storage, no gradient: a program of its own, whose node gives tau nothing
    spikes = F.multi_step("lif", x, backend="host", tau=frozen)[0]
    assert torch.autograd.grad(spikes.sum(), x)[0].shape == x.shape


def test_a_parameter_of_one_value_per_neuron_stays_on_the_python_path(monkeypatch):
    """A tensor parameter of one value per neuron (or per channel) is no [1] input of a plan: the call runs the
    form's launch, with the Python path's results."""
    x = torch.rand(4, 3, 8, dtype=torch.float64) * 2
    tau = torch.full((3, 8), 2.0, dtype=torch.float64)
    program.PROGRAMS.clear()
    got = [F.multi_step("lif", x, backend="host", tau=tau)[0] for _ in range(3)]
    assert all(p.native is None for p in program.PROGRAMS.values())
    monkeypatch.setattr(program, "ENABLED", False)
    want = F.multi_step("lif", x, backend="host", tau=tau)[0]
    assert all(torch.equal(g, want) for g in got)


def test_stbif_runs_its_one_value_buffers_through_the_native_path(monkeypatch):
    """STBIFNode's thresholds are buffers of one value: its inference calls take the native path."""
    from autocuda.nn import STBIFNode

    layer = STBIFNode(0.5, 8, sym=True, step_mode="m", backend="host").double()
    x = torch.randn(6, 3, 5, dtype=torch.float64) * 2
    monkeypatch.setattr(program, "ENABLED", False)
    want = layer(x)
    layer.reset()
    monkeypatch.setattr(program, "ENABLED", True)
    for _ in range(3):
        layer.reset()
        got = layer(x)
    assert any(p.native is not None and p.tensors for p in layer._programs.values())
    assert torch.equal(got, want)


def test_a_state_tensor_unlike_the_plans_takes_a_program_of_its_own():
    """A state's alignment and need of a gradient are part of a call's key: a state whose address is not the
    first call's (a view one element in) runs a program bound to it, with the Python path's results."""
    program.PROGRAMS.clear()
    x = torch.rand(3, 64) * 2
    aligned, shifted = torch.zeros(64), torch.zeros(65)[1:]
    results = [F.multi_step("lif", x, v, backend="host")[0] for v in (aligned, aligned, shifted, shifted)]
    assert len({key for key in program.PROGRAMS}) == 2
    program.ENABLED = False
    try:
        want = F.multi_step("lif", x, torch.zeros(64), backend="host")[0]
    finally:
        program.ENABLED = True
    assert all(torch.equal(r, want) for r in results)


def test_a_native_training_call_records_a_cpp_node_whose_second_derivative_fails():
    x = (torch.rand(4, 64, dtype=torch.float64) * 2).requires_grad_()
    F.multi_step("lif", x, backend="host")[0].sum().backward()  # binds the backward launches
    spikes = F.multi_step("lif", x, backend="host")[0]
    assert spikes.grad_fn.name() == "autocuda::NeuronCallBackward"
    (grad,) = torch.autograd.grad(spikes.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):  # toward x alone, beside another term: the
        torch.autograd.grad((grad ** 2).sum() + (x ** 2).sum(), x, retain_graph=True)  # failing node leads to x
    with pytest.raises(RuntimeError, match="differentiable once"):
        grad.sum().backward()


def test_hidden_outputs_are_not_differentiable_and_unused_gradients_cost_nothing():
    """Only the spikes in the loss: the kernel without final-state gradients runs (no zero tensors are made for
    them), and x's gradient equals the Python path's."""
    x = (torch.rand(4, 64) * 2).requires_grad_()
    F.multi_step("lif", x, backend="host")[0].sum().backward()  # binds the backward launches
    spikes, (v,), _ = F.multi_step("lif", x, backend="host")
    assert spikes.requires_grad and v.requires_grad and "NeuronCall" in spikes.grad_fn.name()
    (grad,) = torch.autograd.grad(spikes.sum(), x)
    program.ENABLED = False
    try:
        (want,) = torch.autograd.grad(F.multi_step("lif", x, backend="host")[0].sum(), x)
    finally:
        program.ENABLED = True
    assert torch.equal(grad, want)


def program_plans() -> set[int]:
    return {int(p.native) for p in program.PROGRAMS.values() if p.native is not None}


def forget_programs() -> set[int]:
    """Drop the functional calls' programs: the numbers of the plans they held, each of which must now be free
    (the ops' own forms hold the plans of the op implementations they ran, a backward's here)."""
    held, live = program_plans(), native.live_plans()
    program.PROGRAMS.clear()
    collect_everything()
    assert native.live_plans() == live - len(held)
    return held


def test_plans_live_while_held_and_nodes_keep_theirs():
    """Plans follow their holders: calls of ever new shapes leave no plans behind once their programs are dropped
    (a layer's programs clear at their limit, functional calls' here by hand); a training call's autograd node
    keeps the plan it ran, after its program let go, until its backward, whose gradient is the Python path's; a
    freed number serves the next plan; a plan's number copies as itself and pickles as a plain int."""
    forget_programs()
    before = native.live_plans()
    for n in range(64, 72):  # a new shape each: a program and a plan each
        for _ in range(2):
            F.multi_step("lif", torch.rand(4, n), backend="host")
    assert native.live_plans() == before + 8 and len(program_plans()) == 8
    freed = forget_programs()
    x = (torch.rand(4, 40, dtype=torch.float64) * 2).requires_grad_()
    weights = torch.arange(1, 5, dtype=x.dtype).view(4, 1)
    F.multi_step("lif", x, backend="host")[0].sum().backward()  # binds the backward launches: planned next call
    spikes = F.multi_step("lif", x, backend="host")[0]
    assert spikes.grad_fn.name() == "autocuda::NeuronCallBackward" and len(program_plans()) == 1
    assert program_plans() <= freed  # a freed number taken again
    forget_programs()
    (grad,) = torch.autograd.grad((spikes * weights).sum(), x)  # by the plan the node kept
    program.ENABLED = False
    try:
        (want,) = torch.autograd.grad((F.multi_step("lif", x, backend="host")[0] * weights).sum(), x)
    finally:
        program.ENABLED = True
    assert torch.equal(grad, want)
    for _ in range(2):
        F.multi_step("lif", torch.rand(4, 64), backend="host")
    number = next(p.native for p in program.PROGRAMS.values() if p.native is not None)
    assert copy.deepcopy(number) is number and copy.copy(number) is number
    assert type(pickle.loads(pickle.dumps(number))) is int
    held = int(number)
    del number  # a holder too
    assert forget_programs() == {held}


def test_threads_making_and_dropping_plans_leave_none_behind():
    """Four threads, each with layers of its own over shapes of its own, training calls (autograd nodes that hold
    their plans) and the layers' programs dropped before their backward: every result the Python path's; a second
    round leaves as many plans as the first (the ops' forms keep the plans of the backward implementations they ran,
    the programs' plans are freed); a number no holder has is refused by name."""
    import threading

    from autocuda.nn import LIFNode

    forget_programs()
    before = native.live_plans()
    xs = {n: (torch.rand(4, n, dtype=torch.float64) * 2) for n in range(40, 48)}
    program.ENABLED = False
    try:
        wants = {n: torch.autograd.grad(F.multi_step("lif", x.requires_grad_(), backend="host")[0].sum(), x)[0]
                 for n, x in xs.items()}
    finally:
        program.ENABLED = True
    failures: list[BaseException] = []

    def work(sizes: list[int]) -> None:
        try:
            for n in sizes:
                layer = LIFNode(tau=2.0, step_mode="m", backend="host")
                for _ in range(3):  # the third call by its native plan, its node holding the plan
                    layer.reset()
                    x = xs[n].detach().requires_grad_()
                    spikes = layer(x)
                    del layer._programs  # the layer's programs dropped before its backward
                    (grad,) = torch.autograd.grad(spikes.sum(), x)
                    assert torch.equal(grad, wants[n])
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    live = []
    for _ in range(2):
        threads = [threading.Thread(target=work, args=([40 + i, 44 + i] * 2,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        collect_everything()
        live.append(native.live_plans())
    assert live[0] == live[1] <= before + len(xs)  # at most a backward's plan per shape
    with pytest.raises(RuntimeError, match="no holder to release"):
        torch.ops.autocuda_native.release_plan(10**6)


def test_a_call_unlike_its_plan_is_refused_by_the_operator():
    program.PROGRAMS.clear()
    x = torch.rand(4, 64)
    for _ in range(2):
        F.multi_step("lif", x, backend="host")
    number = next(p.native for key, p in program.PROGRAMS.items() if key[1] == (4, 64) and p.native is not None)
    with pytest.raises(RuntimeError, match="is not the call plan"):
        native.call(number, torch.rand(4, 65), [], [0.0, 2.0, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="is not the call plan"):  # a state tensor where its plan takes numbers
        native.call(number, x, [torch.zeros(64)], [2.0, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="numbers"):
        native.call(number, x, [], [0.0])


def test_a_meta_tensor_of_a_planned_key_is_refused_as_the_host_runner_refuses_it():
    """Host calls take the native path for CPU tensors only: a meta x, whose plan's words would be the CPU call's,
    takes the bound launch, which names the device."""
    program.PROGRAMS.clear()
    for _ in range(2):  # the second call makes the CPU call's plan
        F.multi_step("lif", torch.rand(4, 3), backend="host")
    assert any(p.native is not None for p in program.PROGRAMS.values())
    for _ in range(2):
        with pytest.raises(ValueError, match="runs kernels on CPU tensors; got tensors on meta"):
            F.multi_step("lif", torch.rand(4, 3, device="meta"), backend="host")


@pytest.mark.parametrize("cut", [1, 7, 30])
def test_malformed_plans_are_refused_naming_the_plan(cut):
    program.PROGRAMS.clear()
    x = torch.rand(4, 64).requires_grad_()
    for _ in range(2):
        F.multi_step("lif", x, backend="host")[0].sum().backward()
    found = next(p for p in program.PROGRAMS.values() if p.native is not None)
    numbers = [0.0, *found.scalar_values(found.values({}, x, (64,)))]
    words = native_plan.plan_words(x.detach(), [], len(numbers), found.launch, found.bound_form, *found.backward)
    assert native.make_plan(words.words, words.dtypes) == found.native  # identical plans are one plan
    with pytest.raises(RuntimeError, match="autocuda native plan"):
        native.make_plan(words.words[:-cut], words.dtypes)
    bad = list(words.words)
    bad[2] = -1  # numbers: every number slot then reads out of range
    with pytest.raises(RuntimeError, match="autocuda native plan"):
        native.make_plan(bad, words.dtypes)
    bad = list(words.words)
    bad[3] = 2  # inputs: a call giving a state tensor the forward launch does not take
    with pytest.raises(RuntimeError, match="autocuda native plan"):
        native.make_plan(bad, words.dtypes)


@pytest.mark.parametrize("value, expected, host", [("", True, False), ("1", True, True), ("on", True, True),
                                                   ("0", False, False), ("OFF", False, False)])
def test_the_switch(value, expected, host, monkeypatch):
    """On for CUDA calls unless turned off; on for host calls only where asked for by name."""
    monkeypatch.setenv(native.VARIABLE, value)
    assert native.enabled() is expected and native.on_host() is host


def test_a_bad_switch_is_named(monkeypatch):
    monkeypatch.setenv(native.VARIABLE, "maybe")
    with pytest.raises(ValueError, match="AUTOCUDA_NATIVE='maybe'"):
        native.enabled()


def test_the_library_is_cached_and_checked():
    """The library lives in the host cache under a key of its source, torch and the compiler, with the store's
    checksum: a library whose bytes changed is not found (it would be rebuilt, never loaded)."""
    from autocuda.toolchain import store
    from autocuda.toolchain.host import cache

    found = cache.find(native._key())
    assert found is not None and store.verified(found)
    assert native.status() == "loaded"


def test_binding_backward_and_planning_draw_nothing_from_torchs_random_generator():
    """A training program binds its backward launches at its first backward, to fresh gradients of the call's
    shape (zeros) and the call's saved tensors, and makes its plan at the next call: neither draws from torch's
    generator, so a model's dropout masks after them are those of the Python path."""
    program.PROGRAMS.clear()
    x = (torch.rand(3, 40, dtype=torch.float64) * 2).requires_grad_()
    torch.manual_seed(7)
    F.multi_step("lif", x, backend="host")[0].sum().backward()
    assert all(p.backward is not None for p in program.PROGRAMS.values())
    F.multi_step("lif", x, backend="host")
    assert any(plan is not None for plan in native_plans())
    after = torch.rand(4)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(4), after)


def test_a_training_program_binds_its_backward_at_its_first_backward():
    """Forward calls alone bind no backward launch; the first backward binds both (with and without the final
    states' gradients), and only then is the native plan made."""
    program.PROGRAMS.clear()
    x = (torch.rand(3, 40, dtype=torch.float64) * 2).requires_grad_()
    for _ in range(3):
        spikes = F.multi_step("lif", x, backend="host")[0]
    (found,) = program.PROGRAMS.values()
    assert found.backward is None and found.native is None
    spikes.sum().backward()
    with_finals = found.backward[1]
    assert found.backward[0] is not None and with_finals is not None and found.native is None
    F.multi_step("lif", x, backend="host")
    assert found.native is not None


# A stand-in for the C++ compiler: it answers --version, and "compiles" by waiting for the file $GATE, then copying
# the library built for this file's tests ($LIBRARY) to its -o argument. The build it runs is the helper's, in full,
# less the compiler's tens of seconds; the gate holds it open until the test says.
STAND_IN_COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "stand-in compiler 1"; exit 0; fi
while [ ! -e "$GATE" ]; do sleep 0.05; done
previous=""
for argument; do [ "$previous" = "-o" ] && output="$argument"; previous="$argument"; done
cp "$LIBRARY" "$output"
"""


def test_a_process_that_exits_while_the_library_builds_leaves_the_build_to_finish(tmp_path):
    """The build runs in a helper process: a short script neither waits for it nor loses it, and the next
    process loads the library from the cache at once. The compiler (a stand-in, above) cannot finish until the
    first script has exited, so a script that waited for the build would never end (its timeout fails it)."""
    import os
    import shutil
    import stat

    from autocuda.toolchain import store
    from autocuda.toolchain.host import cache

    compiler = tmp_path / "stand-in-c++"
    compiler.write_text(STAND_IN_COMPILER)
    compiler.chmod(compiler.stat().st_mode | stat.S_IXUSR)
    built = cache.find(native._key())
    assert built is not None
    shutil.copyfile(built, tmp_path / "library.so")
    gate = tmp_path / "gate"
    env = {**os.environ, "AUTOCUDA_CACHE_DIR": str(tmp_path / "cache"), "AUTOCUDA_NATIVE": "1",
           "CXX": str(compiler), "GATE": str(gate), "LIBRARY": str(tmp_path / "library.so")}
    script = ("from autocuda import native\n"
              "assert not native.loaded() and native.status() == 'building', native.status()\n")
    python_children.run(["-c", script], env=env, check=True, timeout=120)
    assert not [p for p in (tmp_path / "cache").rglob("native-*.so")], "the library was stored before the gate"
    gate.touch()  # the script has ended: now its helper may finish the build
    _wait_for_a_stored_library(tmp_path / "cache", store)
    script = "from autocuda import native\nassert native.loaded(), native.status()\n"
    python_children.run(["-c", script], env=env, check=True, timeout=120)


def _wait_for_a_stored_library(folder, store) -> None:
    """Until a verified native library is in `folder` (the helper's, whose end the test cannot wait on)."""
    import time

    for _ in range(6000):  # 5 minutes: a backstop against a lost helper, not a measure of the build
        if [p for p in folder.rglob("native-*.so") if store.verified(p)]:
            return
        time.sleep(0.05)
    raise AssertionError("the helper stored no library")


@pytest.mark.skipif(profile() != "slow", reason="builds the library from scratch with the real compiler: --slow")
def test_a_process_that_exits_while_the_real_compiler_builds_leaves_the_build_to_finish(tmp_path):
    """As above, with the real compiler building the library from its source in a fresh cache."""
    import os

    from autocuda.toolchain import store

    env = {**os.environ, "AUTOCUDA_CACHE_DIR": str(tmp_path / "cache"), "AUTOCUDA_NATIVE": "1"}
    script = ("from autocuda import native\n"
              "assert not native.loaded() and native.status() == 'building', native.status()\n")
    python_children.run(["-c", script], env=env, check=True, timeout=120)
    _wait_for_a_stored_library(tmp_path / "cache", store)
    script = "from autocuda import native\nassert native.loaded(), native.status()\n"
    python_children.run(["-c", script], env=env, check=True, timeout=120)
