"""The ops' implementations through the native operator (`ops.NativePlans`: the one launch of a form's call as a plan,
run by `op_call`): what torch.compile and direct calls of `autocuda::neuron_*` run. Forward and backward give the
Python launch's outputs bitwise, a plan runs them, and a call the plan does not fit takes the Python launch, which
names what is wrong (host runner here; CUDA in tests/gpu/test_native_gpu.py)."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched

from autocuda.call import functional as F
from autocuda.call import native, ops, program

pytestmark = pytest.mark.usefixtures("native_on_host")  # the library is built for this file's tests (conftest)

N = 24
# (spec, single step, store_state_seq, initial states as tensors, a tensor parameter per neuron)
CASES = [("lif", False, False, False, False), ("alif", False, True, True, False), ("izhikevich", True, False, True,
                                                                                    False),
         ("lif", False, False, False, True), ("lif", True, False, False, True)]
IDS = ["-".join(str(int(v)) if isinstance(v, bool) else v for v in case) for case in CASES]


def op_call(case: tuple, x: torch.Tensor) -> list[torch.Tensor]:
    """A forward op call of `case` and its backward through the op's autograd (a loss weighing every output and
    step differently): the outputs, then the gradients of x, the tensor initial states and the tensor parameters."""
    spec, single, store, tensors, per_neuron = case
    x = x.clone().requires_grad_()
    params = {"tau": torch.linspace(1.5, 3.0, N, dtype=x.dtype).requires_grad_()} if per_neuron else {}
    call = program.Call(spec, x, (N,), [], None, False, None, "host", params)
    seeded = torch.Generator().manual_seed(2)
    states = [torch.rand(N, dtype=x.dtype, generator=seeded).requires_grad_() for _ in call.state_names] \
        if tensors else []
    initial = [] if tensors else [float(s) for s in call.states]
    parameters = call.tensor_args()
    scalars = [float(v) for v in call.program.scalar_values(call.values)]
    outputs = torch.ops.autocuda.neuron_forward(call.key, x, states, initial, parameters, scalars, store, True, True,
                                                [])
    (spike, finals, seqs), _, _ = ops.form_layout(call.key, single, store, True, tensors, True)
    shown = [outputs[spike], *(outputs[i] for i in (*finals, *seqs))]
    loss = sum((o * torch.arange(1, o.numel() + 1, dtype=o.dtype).view(o.shape)).sum() / (k + 1)
               for k, o in enumerate(shown))
    inputs = [x, *states, *(params.values())]
    return [*shown, *torch.autograd.grad(loss, inputs)]


def spy_plans(monkeypatch) -> list[bool]:
    """Whether each op implementation's call ran a native plan (`ops.NativePlans.run`), in order."""
    ran: list[bool] = []
    planned = ops.NativePlans.run
    monkeypatch.setattr(ops.NativePlans, "run", lambda *a: (lambda r: (ran.append(r is not None), r)[1])(planned(*a)))
    return ran


def inputs(case: tuple, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.rand((N,) if case[1] else (6, N), dtype=dtype) * 2


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the calls below, compiled up front (`conftest.compile_launched`)."""
    saved = native.USE
    native.USE = False  # the Python launches, which record what they launch
    try:
        return compile_launched(*(functools.partial(op_call, case, inputs(case, dtype))
                                  for case in CASES for dtype in (torch.float32, torch.float64)))
    finally:
        native.USE = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_calls_by_plans_equal_the_python_launch(case, dtype, monkeypatch):
    x = inputs(case, dtype)
    monkeypatch.setattr(native, "USE", False)
    want = op_call(case, x)
    monkeypatch.setattr(native, "USE", True)
    ran = spy_plans(monkeypatch)
    for _ in range(2):  # the first call makes the plans, the second finds them
        got = op_call(case, x)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
    assert ran == [True, True] * 2, "a plan ran each forward and each backward"


def test_a_compiled_training_call_runs_the_plans(monkeypatch):
    """torch.compile reaches the ops through the dispatcher: their implementations run the plans."""
    x = inputs(CASES[0], torch.float64)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spikes, (v,), _ = F.multi_step("lif", x, 0.0, tau=2.0, backend="host")
        return spikes, v

    def train(run) -> list[torch.Tensor]:
        given = x.clone().requires_grad_()
        spikes, v = run(given)
        ((spikes * torch.arange(1, 7, dtype=x.dtype).view(-1, 1)).sum() + v.sum()).backward()
        return [spikes, v, given.grad]

    monkeypatch.setattr(native, "USE", False)
    want = train(step)
    monkeypatch.setattr(native, "USE", True)
    ran = spy_plans(monkeypatch)
    got = train(torch.compile(step, backend="aot_eager", fullgraph=True))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert ran == [True, True], "the compiled forward and backward ran plans"


def test_tensors_the_plan_does_not_fit_take_the_python_launch_which_names_them():
    case = CASES[1]
    x = inputs(case, torch.float64)
    op_call(case, x)  # the plans made
    call = program.Call("alif", x, (N,), [], None, False, None, "host", {})
    states = [torch.rand(2 * N, dtype=x.dtype)[::2] for _ in call.state_names]  # not contiguous
    scalars = [float(v) for v in call.program.scalar_values(call.values)]
    with pytest.raises(Exception, match="contiguous"):
        torch.ops.autocuda.neuron_forward(call.key, x, states, [], [], scalars, True, True, True, [])
