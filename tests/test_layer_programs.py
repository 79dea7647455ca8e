"""A layer's programs (`autocuda.call.program`, owned by the layer: `layer._programs`): a layer's call like an earlier
one runs that call's program; any change of what the key holds (the layer's switches, the compile-time constants'
values, x's shape, dtype, alignment, contiguity or grad, the states' and parameters' types) runs the program the
change asks for. A layer whose switches and parameters are the objects they were, called from a reset or going on
from its tensor states, in either step mode, finds its program by the key with the configuration's part it kept
(`nn.layer_call.run_keyed`; the program runs the native operator or its bound launch), and no changed call takes that
path. On the host runner, every result and gradient
equals the unbound path's bitwise."""
from __future__ import annotations

import copy
import functools
import pickle

import pytest
import torch
from conftest import compile_launched

from autocuda.call import native, program
from autocuda.nn import LIFNode, Neuron, ParametricLIFNode
from autocuda.spec.load import spec_from_toml

# Host calls through the native path here, as CUDA calls take it by default (the GPU file runs these cores on CUDA)
pytestmark = pytest.mark.usefixtures("native_on_host")

GAIN_LIF_TOML = """
name = "gain_lif"
charge = "v + (a0 * x - (v - v_reset)) / tau"
reset = "hard"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
a0 = { default = 1.0, kind = "constant" }
[states]
v = "v_reset"
"""
GAIN_LIF = spec_from_toml(GAIN_LIF_TOML)


def x_of(shape=(5, 3, 4), dtype=torch.float64, grad=True, device="cpu"):
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    return x.to(device, dtype).requires_grad_(grad)


def outcome(layer, x):
    """The layer's output from a reset, its final membrane and, where x records a graph, x's gradient."""
    layer.reset()
    out = layer(x)
    results = [out, layer.v]
    if out.grad_fn is not None:
        weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
        results.append(torch.autograd.grad((out * weights).sum(), x)[0])
    return results


def full_path(layer, x, monkeypatch, run=None):
    """The call's results (`run`: `outcome` unless given) through no bound launch, native plan or kept configuration
    (`program.ENABLED` off)."""
    monkeypatch.setattr(program, "ENABLED", False)
    try:
        return (run or outcome)(layer, x)
    finally:
        monkeypatch.setattr(program, "ENABLED", True)


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w), what


def misaligned(x):
    """x's values in storage that starts one element later: contiguous, its address not 16-byte aligned."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
    return flat.view(x.shape).copy_(x.detach()).requires_grad_(x.requires_grad)


# change -> (how, whether the layer's call then builds another program of its own: False where it is the same
# call, or where functional calls' programs run it: recompute's checkpoint, a view that is not contiguous)
CHANGES = {
    "tau (a number: the same call)": (lambda layer, x: (setattr(layer, "tau", 3.0), x)[1], False),
    "a0 (a constant: another kernel)": (lambda layer, x: (setattr(layer, "a0", 2.5), x)[1], True),
    "v_reset None (a soft reset)": (lambda layer, x: (setattr(layer, "v_reset", None), x)[1], True),
    "detach_reset": (lambda layer, x: (setattr(layer, "detach_reset", True), x)[1], True),
    "store_v_seq": (lambda layer, x: (setattr(layer, "store_v_seq", True), x)[1], True),
    "save_h": (lambda layer, x: (setattr(layer, "save_h", False), x)[1], True),
    "recompute": (lambda layer, x: (setattr(layer, "recompute", True), x)[1], False),
    "backend torch (the reference)": (lambda layer, x: (setattr(layer, "backend", "torch"), x)[1], True),
    "dtype": (lambda layer, x: x.detach().float().requires_grad_(), True),
    "shape": (lambda layer, x: x.detach()[:3].clone().requires_grad_(), True),
    "neuron shape": (lambda layer, x: x.detach()[:, :2].clone().requires_grad_(), True),
    "no grad": (lambda layer, x: x.detach(), True),
    "grad again": (lambda layer, x: x.detach().requires_grad_(), True),  # after calls without it (below)
    "misaligned": (lambda layer, x: misaligned(x), True),
    "not contiguous": (lambda layer, x: x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(),
                       False),
    "another shape, as many neurons": (lambda layer, x: x.detach().flatten(1).requires_grad_(), True),
    "as many elements, another step count": (lambda layer, x: x.detach().reshape(1, -1).requires_grad_(), True),
    "tau, the same float object": (lambda layer, x: (setattr(layer, "tau", layer.tau), x)[1], False),
}
# the changes after which the layer's keyed call still serves: nothing its kept configuration was worked out from
# changed, and x is of a class it has a program for
SERVED = {"tau, the same float object"}


def keyed_runs(monkeypatch):
    """The list that each keyed call of a layer (`nn.layer_call.run_keyed`: its program's `run_layer`) with results
    appends to: x's shape, and whether the native operator ran it (else the program's bound launch)."""
    ran = []
    original = program.Program.run_layer

    def spy(self, x, states, numbers, params=()):
        results = original(self, x, states, numbers, params)
        if results:
            ran.append((tuple(x.shape), self.native is not None and native.USE))
        return results

    monkeypatch.setattr(program.Program, "run_layer", spy)
    return ran


def needs_the_native_operator():
    if not native.USE:
        pytest.skip("the native call path is off (AUTOCUDA_NATIVE=0)")
    if not native.ensure():
        pytest.skip(f"the native operator is not loaded ({native.status()})")


def check_change(change, monkeypatch, layer, x):
    """Two calls of `layer` on x, then `change` and two more: each equal to the full path's."""
    make, another = CHANGES[change]
    for _ in range(2):  # builds the program (and its native plan, after the first backward), then keeps its key
        assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "before")
    before = set(map(id, layer._programs.values()))
    ran = keyed_runs(monkeypatch)
    changed = make(layer, x)
    got = outcome(layer, changed)
    built = [p for p in layer._programs.values() if id(p) not in before]
    served = change in SERVED  # the keyed call ran: no other program asked
    assert bool(ran) == served, change
    assert bool(built) == (another and not served), change
    assert_same(got, full_path(layer, changed, monkeypatch), change)
    assert_same(outcome(layer, changed), got, f"{change}, again")
    if layer.backend == "torch":  # torch's ops ran, not a kernel: autograd recorded theirs
        assert "NeuronCall" not in got[0].grad_fn.name() and got[0].grad_fn.name() != "_EagerBackward"
    if layer.store_v_seq:
        assert layer.v_seq.shape == changed.shape


@pytest.fixture(scope="module", autouse=True)
def host_kernels() -> int:
    """The host kernels of the tests' calls, compiled up front many to a compiler run (`conftest.compile_launched`,
    on the Python path: a native plan loads the same kernels, the bound launches' own): the calls would compile them
    one or a few a run."""
    def changed(change: str) -> None:
        layer = Neuron(GAIN_LIF, step_mode="m", backend="host")
        x = x_of(grad=change != "grad again")
        outcome(layer, x)
        outcome(layer, CHANGES[change][0](layer, x))

    def lif(shape: tuple[int, ...], grad: bool) -> None:
        outcome(LIFNode(tau=2.0, step_mode="m", backend="host"), x_of(shape, grad=grad))

    return compile_launched(*(functools.partial(changed, change) for change in CHANGES),
                            *(functools.partial(lif, shape, grad) for shape in ((5, 12), (5, 3, 4))
                              for grad in (False, True)))


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_between_calls_runs_the_call_it_asks_for(change, monkeypatch):
    layer = Neuron(GAIN_LIF, step_mode="m", backend="host")
    check_change(change, monkeypatch, layer, x_of(grad=change != "grad again"))


def test_a_repeated_call_builds_no_program_and_reads_the_numbers_afresh(monkeypatch):
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of()
    outcome(layer, x)
    built = []
    original = program.Program.__init__
    monkeypatch.setattr(program.Program, "__init__", lambda *a, **k: (built.append(a), original(*a, **k))[1])
    for tau in (2.0, 4.0, 8.0):
        layer.tau = tau
        got = outcome(layer, x)
        assert_same(got, full_path(layer, x, monkeypatch), tau)
    assert built == [], "the layer's program ran every call: a number's value is no part of its key"


def test_tensor_states_and_parameters_give_the_full_paths_results(monkeypatch):
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    outcome(layer, x)
    layer.v = torch.full((3, 4), 0.5, dtype=torch.float64)  # a call that goes on from a tensor state
    got = layer(x)
    layer.v = torch.full((3, 4), 0.5, dtype=torch.float64)
    monkeypatch.setattr(program, "ENABLED", False)
    assert torch.equal(got, layer(x))
    monkeypatch.setattr(program, "ENABLED", True)
    layer.tau = torch.tensor(3.0, dtype=torch.float64)
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "tensor tau")


def test_copies_of_a_layer_start_without_its_programs():
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    want = outcome(layer, x)
    assert layer._programs and layer._programs.configured is not None
    for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert copied._programs is not layer._programs and not copied._programs
        assert copied._programs.configured is None
        assert_same(outcome(copied, x), want, type(copied))
    old = pickle.loads(pickle.dumps(layer))
    del old.__dict__["_programs"]  # a layer pickled before layers kept their programs
    assert_same(outcome(old, x), want, "no _programs")


def check_keyed(layer, x, monkeypatch, native_runner=True):
    """A layer called from a reset on x keeps its configuration's part of the key, then finds its program by the
    key and runs it (`native_runner`: the native operator, made at the call after the program's first backward
    where x records a graph; else the bound launch), working out no configuration again, with the full path's
    results."""
    want = full_path(layer, x, monkeypatch)
    for _ in range(2 if x.requires_grad and native_runner else 1):
        assert_same(outcome(layer, x), want, "builds")
    ran = keyed_runs(monkeypatch)
    configurations = []
    original = program.configuration_key
    monkeypatch.setattr(program, "configuration_key", lambda *a: (configurations.append(a), original(*a))[1])
    for _ in range(3):
        got = outcome(layer, x)
        assert_same(got, want, "again")
        assert layer.v.shape == x.shape[1:] and (got[0].grad_fn is not None) == x.requires_grad
    assert ran == [(tuple(x.shape), native_runner)] * 3, "three calls, each its program's by the kept key"
    assert configurations == [], "no configuration worked out again"


@pytest.mark.parametrize("native_runner", [True, False], ids=["native", "bound"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(5, 12), (5, 3, 4)])
def test_a_layer_called_from_a_reset_finds_its_program_by_the_kept_key(shape, grad, native_runner, monkeypatch):
    if native_runner:
        needs_the_native_operator()
    monkeypatch.setattr(native, "USE", native_runner)
    check_keyed(LIFNode(tau=2.0, step_mode="m", backend="host"), x_of(shape, grad=grad), monkeypatch, native_runner)


def outcome_with_params(layer, x):
    """`outcome`, with the gradients of the layer's learnable parameters after x's."""
    layer.reset()
    out = layer(x)
    weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
    params = [p for p in layer.parameters() if p.requires_grad]
    return [out, layer.v, *torch.autograd.grad((out * weights).sum(), [x, *params])]


def check_keyed_steps_of_w(layer, x, monkeypatch, steps=3):
    """A ParametricLIF layer's calls after the two that build its program and native plan: each by the keyed call,
    its results and gradients (w's too) the full path's, w then changed in place as by an optimizer's step. Returns
    the spy's list of keyed calls (`keyed_runs`), cleared."""
    for _ in range(2):  # builds the program, binds its backward, then makes its native plan
        outcome_with_params(layer, x)
    ran = keyed_runs(monkeypatch)
    for step in range(steps):
        got = outcome_with_params(layer, x)
        assert_same(got, full_path(layer, x, monkeypatch, outcome_with_params), f"step {step}")
        with torch.no_grad():
            layer.w.sub_(0.5 * got[-1])  # the layer's w, changed in place
    assert ran == [(tuple(x.shape), True)] * steps
    ran.clear()
    return ran


def test_tensor_parameters_of_one_value_take_the_keyed_call(monkeypatch):
    """ParametricLIF's learnable w (a parameter of one value) and a LIF's tau given as a 0-d tensor: the keyed call
    runs them, every result and gradient (w's too) the full path's, also after w changes in place (an optimizer's
    step) or tau's value through `.data`; a w of another object, or of a dtype the plan does not take, runs the full
    path."""
    needs_the_native_operator()
    x = x_of()
    layer = ParametricLIFNode(init_tau=2.5, step_mode="m", backend="host").double()
    ran = check_keyed_steps_of_w(layer, x, monkeypatch)
    layer.w = torch.nn.Parameter(layer.w.detach() + 0.25)  # another object: the full path, then keyed again
    for _ in range(2):
        assert_same(outcome_with_params(layer, x), full_path(layer, x, monkeypatch, outcome_with_params), "new w")
    assert len(ran) == 1
    ran.clear()
    layer.w.data = layer.w.data.float()  # the same object, of a dtype the plan does not take
    assert_same(outcome_with_params(layer, x), full_path(layer, x, monkeypatch, outcome_with_params), "float w")
    assert not ran
    lif = LIFNode(tau=2.0, step_mode="m", backend="host")
    lif.tau = torch.tensor(2.0, dtype=torch.float64)
    xs = x.detach()
    for _ in range(2):
        outcome(lif, xs)
    ran.clear()
    for tau in (3.0, 4.0):
        lif.tau.data.fill_(tau)
        assert_same(outcome(lif, xs), full_path(lif, xs, monkeypatch), f"tau {tau}")
    assert ran == [((5, 3, 4), True)] * 2


def test_alternating_input_classes_each_find_their_program(monkeypatch):
    """Two input classes in turn (a batch size and another, say): each call's key finds its own program."""
    needs_the_native_operator()
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    xs = [x_of((5, 3, 4), grad=False), x_of((5, 2, 4), grad=False)]
    wants = [full_path(layer, x, monkeypatch) for x in xs]
    for x, want in zip(xs, wants):
        assert_same(outcome(layer, x), want, "builds")
    ran = keyed_runs(monkeypatch)
    for x, want in zip(xs * 2, wants * 2):
        assert_same(outcome(layer, x), want, "again")
    assert ran == [((5, 3, 4), True), ((5, 2, 4), True)] * 2


def keyed_layer(monkeypatch):
    """A LIF layer that keeps its configuration from a call on x (no grad), x, the call's results and the keyed
    calls' runs from now on."""
    needs_the_native_operator()
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    want = outcome(layer, x)
    return layer, x, want, keyed_runs(monkeypatch)


def test_the_switches_turn_the_keyed_call_off_or_to_the_bound_launch(monkeypatch):
    """`program.ENABLED` off: no program runs the call; `native.USE` off: the program's bound launch runs it."""
    layer, x, want, ran = keyed_layer(monkeypatch)
    monkeypatch.setattr(native, "USE", False)
    assert_same(outcome(layer, x), want, "native.USE")
    assert ran == [(tuple(x.shape), False)]
    monkeypatch.setattr(program, "ENABLED", False)
    assert_same(outcome(layer, x), want, "program.ENABLED")
    assert ran == [(tuple(x.shape), False)]


def test_a_state_that_is_not_a_float_leaves_the_keyed_call(monkeypatch):
    layer, x, _, ran = keyed_layer(monkeypatch)
    for value in (0.25, 1, torch.tensor(0.25, dtype=torch.float64)):  # a float, an int, a 0-d tensor
        layer.reset()
        layer.v = value
        got = layer(x)
        layer.v = value
        monkeypatch.setattr(program, "ENABLED", False)
        assert torch.equal(got, layer(x)), value
        monkeypatch.setattr(program, "ENABLED", True)
    assert ran == [((5, 3, 4), True)], "only the float state took the keyed call"


def steps_outcome(layer, x):
    """The layer's single steps over x's first dim from a reset: each step's output, the final membrane and, where x
    records a graph, x's gradient (of all steps' outputs, weighted)."""
    layer.reset()
    outs = [layer(x[t]) for t in range(x.shape[0])]
    results = [*outs, layer.v]
    if outs[0].grad_fn is not None:
        total = sum((out * (t + 1)).sum() for t, out in enumerate(outs))
        results.append(torch.autograd.grad(total, x)[0])
    return results


def check_steps_keyed(layer, x, monkeypatch):
    """Step mode 's' over x's first dim: the first step after a reset (float states) and the steps that go on from
    the tensor states each find their program by the kept key, run by the native operator, with the full path's
    results and gradients."""
    want = full_path(layer, x, monkeypatch, steps_outcome)
    for _ in range(2):  # builds the programs (the native plans after their first backward)
        assert_same(steps_outcome(layer, x), want, "builds")
    ran = keyed_runs(monkeypatch)
    assert_same(steps_outcome(layer, x), want, "keyed")
    assert ran == [(tuple(x.shape[1:]), True)] * x.shape[0], "each step by its program's native plan"
    assert layer.v.shape == x.shape[1:] and layer._programs.configured is not None


def frozen_plif() -> ParametricLIFNode:
    """A ParametricLIF in step mode 's' whose w takes no gradient: its steps record no graph where x records none."""
    layer = ParametricLIFNode(init_tau=2.5, step_mode="s", backend="host").double()
    layer.w.requires_grad_(False)
    return layer


@pytest.mark.parametrize("make", [lambda grad: LIFNode(tau=2.0, step_mode="s", backend="host"),
                                  lambda grad: ParametricLIFNode(init_tau=2.5, step_mode="s", backend="host").double()
                                  if grad else frozen_plif()], ids=["LIFNode", "ParametricLIFNode"])
@pytest.mark.parametrize("grad", [False, True])
def test_single_steps_find_their_programs_by_the_kept_key(grad, make, monkeypatch):
    needs_the_native_operator()
    check_steps_keyed(make(grad), x_of((5, 3, 4), grad=grad), monkeypatch)


def check_going_on(layer, chunks, monkeypatch):
    """Step mode 'm' without a reset between calls (truncated BPTT's chunks, chunks[i]): the states are the last
    call's tensors, and each call after the first finds its program by the kept key, with the full path's
    results."""
    grad = chunks.requires_grad

    def going_on():
        layer.reset()
        results = []
        for chunk in chunks:
            out = layer(chunk)
            results += [out, layer.v]
            if grad:
                results.append(torch.autograd.grad(out.sum(), chunks, retain_graph=True)[0])
                layer.v = layer.v.detach()  # truncated: the next chunk starts from the values alone
        return results

    monkeypatch.setattr(program, "ENABLED", False)
    want = going_on()
    monkeypatch.setattr(program, "ENABLED", True)
    for _ in range(2):
        assert_same(going_on(), want, "builds")
    ran = keyed_runs(monkeypatch)
    assert_same(going_on(), want, "keyed")
    assert ran == [(tuple(chunks.shape[1:]), True)] * len(chunks), \
        "every chunk by the kept key: the first from numbers, then from tensors"


@pytest.mark.parametrize("grad", [False, True])
def test_a_sequence_that_goes_on_from_tensor_states_finds_its_program(grad, monkeypatch):
    needs_the_native_operator()
    check_going_on(LIFNode(tau=2.0, step_mode="m", backend="host"), x_of((4, 5, 3), grad=grad), monkeypatch)


def test_the_kept_key_serves_its_own_step_mode_only(monkeypatch):
    """A configuration kept by calls in one step mode is not used by the other: a single step on x [3, 4] is no
    sequence of three steps of four neurons (a program of that key exists), and the reverse."""
    needs_the_native_operator()
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of((3, 4), grad=False)
    sequence = outcome(layer, x)
    outcome(layer, x)  # kept
    ran = keyed_runs(monkeypatch)
    layer.step_mode = "s"
    step = outcome(layer, x)
    assert ran == [], "a single step did not run the sequence's program"
    assert step[0].shape == (3, 4) and step[1].shape == (3, 4) and not torch.equal(step[0], sequence[0])
    assert_same(step, full_path(layer, x, monkeypatch), "a single step")
    assert_same(outcome(layer, x), step, "a single step, kept")
    assert ran == [((3, 4), True)], "kept for single steps now"
    layer.step_mode = "m"
    assert_same(outcome(layer, x), sequence, "a sequence again")
    assert ran == [((3, 4), True)], "a sequence did not run the single step's program"


def test_tensor_states_of_another_shape_or_dtype_leave_the_keyed_call(monkeypatch):
    """A state of another shape restarts at its initial value and one of another dtype is converted, as on the full
    path (SpikingJelly's rule): the keyed call leaves both to it."""
    needs_the_native_operator()
    layer = LIFNode(tau=2.0, step_mode="s", backend="host")
    x = x_of((5, 3, 4), grad=False)
    for _ in range(2):
        steps_outcome(layer, x)
    ran = keyed_runs(monkeypatch)
    for state in (torch.full((4, 3), 0.5, dtype=torch.float64), torch.full((12,), 0.5, dtype=torch.float64),
                  torch.full((3, 4), 0.5, dtype=torch.float32)):  # as many neurons, in another shape; another dtype
        layer.v = state
        got = [layer(x[0]), layer.v]
        layer.v = state
        monkeypatch.setattr(program, "ENABLED", False)
        assert_same(got, [layer(x[0]), layer.v], str(state.shape))
        monkeypatch.setattr(program, "ENABLED", True)
    assert ran == [], "neither state took the keyed call"


def test_functorch_transforms_leave_the_keyed_call(monkeypatch):
    layer, x, _, ran = keyed_layer(monkeypatch)

    def loss(inp):
        layer.reset()
        return layer(inp).sum()

    with pytest.raises(RuntimeError, match="functorch transforms"):  # the full path's refusal (a kernel backend)
        torch.func.grad(loss)(x)
    assert ran == []


class ScheduledTau(LIFNode):
    """tau read through a property: not an attribute in the layer's dict, so it may change without a write."""

    tau = property(lambda self: self.schedule[-1], lambda self, value: setattr(self, "schedule", [value]))


def test_a_parameter_read_through_a_property_is_read_on_every_call(monkeypatch):
    layer = ScheduledTau(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    outcome(layer, x)
    for tau in (4.0, 8.0):
        layer.schedule.append(tau)
        assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), tau)


def test_the_references_a_layer_passes_decide_its_call(monkeypatch):
    """The spec and surrogate references (set where a layer is built or unpickled) are read on every call."""
    from autocuda.runtime.configs import spec_ref, surrogate_ref
    from autocuda.spec.surrogate import ATan

    layer = Neuron(GAIN_LIF, step_mode="m", backend="host")
    x = x_of()
    outcome(layer, x)
    layer._surrogate_ref = surrogate_ref(ATan(alpha=3.0))
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "surrogate")
    halved = spec_from_toml(GAIN_LIF_TOML.replace("/ tau", "/ (2 * tau)").replace("gain_lif", "halved_gain_lif"))
    layer._spec_ref = spec_ref(halved)
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "spec")
    from autocuda.spec.step import STATE, Output

    # what a spec whose output is its membrane gives a layer (`Neuron._take_output`)
    layer._output, layer._output_program, layer._output_reads_states = Output(STATE, state="v"), None, True
    got = outcome(layer, x)
    assert_same(got, full_path(layer, x, monkeypatch), "output")
    assert not torch.equal(got[0], got[0].round()), "the membrane, not spikes"


def test_without_the_native_operator_the_bound_launch_serves(monkeypatch):
    """Where the native operator cannot be loaded (no compiler, a failed build), a layer's keyed call runs its
    program's bound launch, for every call like the last (training included) with the full path's results."""
    monkeypatch.setattr(native, "loaded", lambda: False)
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of()
    want = full_path(layer, x, monkeypatch)
    assert_same(outcome(layer, x), want, "builds")
    ran = keyed_runs(monkeypatch)
    for _ in range(2):
        assert_same(outcome(layer, x), want, "again")
    assert ran == [(tuple(x.shape), False)] * 2
