"""The native call path on CUDA: programs' calls through the C++ operator and node give the Python path's results
bitwise, in four dtypes, on a side stream, with backward on autograd's device thread, under CUDA graph capture
of an inference program's call; single steps, calls from state tensors and calls with a tensor parameter of one
value; the driver launches what the plan says (a vector layout at N = 2**14); and the ops' implementations, which
torch.compile calls, run one-launch plans."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import functional as F
from autocuda.call import native, program

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def run(spec: str, x: torch.Tensor, finals_in_loss: bool = True) -> list[torch.Tensor]:
    spikes, finals, _ = F.multi_step(spec, x)
    if not x.requires_grad:
        return [spikes, *finals]
    loss = (spikes * 1.5).sum() + (finals[0].float().sum() if finals_in_loss else 0)
    return [spikes, *finals, *torch.autograd.grad(loss, x)]


@pytest.fixture(autouse=True)
def built(monkeypatch):
    monkeypatch.setattr(native, "USE", True)
    if not native.ensure():
        pytest.skip(f"no native call path: {native.status()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec", ["lif", "izhikevich", "alif"])
def test_native_calls_equal_the_python_path_on_the_gpu(spec, dtype, monkeypatch):
    for train, finals_in_loss, n in ((False, False, 2**14), (True, False, 2**14), (True, True, 4097)):
        x = (torch.rand(5, n, device=CUDA) * 2).to(dtype).requires_grad_(train)
        program.PROGRAMS.clear()
        run(spec, x, finals_in_loss)  # builds the program (a training one binds its backward in the gradient)
        got = run(spec, x, finals_in_loss)
        assert any(p.native is not None for p in program.PROGRAMS.values())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # a leaf of its own: its gradient accumulates on the side stream
            side = run(spec, x.detach().requires_grad_(train), finals_in_loss)
        torch.cuda.current_stream().wait_stream(stream)
        monkeypatch.setattr(program, "ENABLED", False)
        want = run(spec, x, finals_in_loss)
        monkeypatch.setattr(program, "ENABLED", True)
        torch.cuda.synchronize()
        for g, s, w in zip(got, side, want, strict=True):
            assert torch.equal(g, w) and torch.equal(s, w)


def test_a_native_backward_runs_on_autograds_device_thread_and_in_a_captured_graph():
    x = (torch.rand(6, 3000, device=CUDA) * 2).requires_grad_()
    F.multi_step("lif", x)[0].sum().backward()  # binds the backward launches
    x.grad = None
    spikes = F.multi_step("lif", x)[0]
    assert "NeuronCall" in spikes.grad_fn.name()
    spikes.sum().backward()  # the engine's CUDA thread launches the backward kernel
    first = x.grad.clone()
    x.grad = None
    program.ENABLED = False
    try:
        F.multi_step("lif", x)[0].sum().backward()
    finally:
        program.ENABLED = True
    assert torch.equal(first, x.grad)

    inputs = torch.rand(6, 3000, device=CUDA) * 2
    for _ in range(2):
        F.multi_step("lif", inputs)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            captured = F.multi_step("lif", inputs)[0]
    inputs.copy_(torch.rand_like(inputs) * 2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, F.multi_step("lif", inputs)[0])


def run_steps(spec: str, x: torch.Tensor, train: bool) -> list[torch.Tensor]:
    """T single steps from the spec's initial numbers, then from the last step's state tensors a multi-step call:
    the outputs and (training) the gradients of x and of the states the multi-step call started from."""
    x = x.detach().requires_grad_(train)
    states: tuple = ()
    outputs = []
    for t in range(x.shape[0]):
        spike, states = F.single_step(spec, x[t], *states)
        outputs += [spike * (t + 1), *states]
    start = tuple(s.detach().requires_grad_(train) for s in states)
    spikes, finals, _ = F.multi_step(spec, x, *start)
    outputs += [spikes, *finals]
    if not train:
        return outputs
    grads = torch.autograd.grad(sum(o.float().sum() for o in outputs), (x, *start))
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec", ["lif", "alif"])
def test_single_steps_and_calls_from_state_tensors_equal_the_python_path_on_the_gpu(spec, dtype, monkeypatch):
    x = (torch.rand(4, 3, 4097, device=CUDA) * 2).to(dtype)
    for train in (False, True):
        monkeypatch.setattr(program, "ENABLED", False)
        want = run_steps(spec, x, train)
        monkeypatch.setattr(program, "ENABLED", True)
        program.PROGRAMS.clear()
        run_steps(spec, x, train)  # builds the programs (training ones bind backward)
        got = run_steps(spec, x, train)
        planned = [p for p in program.PROGRAMS.values() if p.native is not None]
        assert any(p.bound_form.single for p in planned) and any(p.bound_form.given_inits for p in planned)
        torch.cuda.synchronize()
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


def run_tensor_tau(x: torch.Tensor, train: bool) -> list[torch.Tensor]:
    """LIF with tau a learnable float32 tensor of one value (the compute dtype of every x but float64's is float32):
    a multi-step call, then a single step from its final state; the outputs and (training) x's and tau's gradients."""
    x = x.detach().requires_grad_(train)
    tau = torch.tensor(2.5, device=CUDA, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    tau.requires_grad_(train)
    spikes, (v,), _ = F.multi_step("lif", x, tau=tau)
    spike, (v_next,) = F.single_step("lif", x[0], v, tau=tau)
    outputs = [spikes, v, spike, v_next]
    if not train:
        return outputs
    grads = torch.autograd.grad(sum(o.float().sum() for o in outputs), (x, tau))
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_calls_with_a_tensor_parameter_equal_the_python_path_on_the_gpu(dtype, monkeypatch):
    x = (torch.rand(4, 3, 4097, device=CUDA) * 2).to(dtype)
    for train in (False, True):
        monkeypatch.setattr(program, "ENABLED", False)
        want = run_tensor_tau(x, train)
        monkeypatch.setattr(program, "ENABLED", True)
        program.PROGRAMS.clear()
        run_tensor_tau(x, train)
        got = run_tensor_tau(x, train)
        assert any(p.native is not None and p.tensors for p in program.PROGRAMS.values())
        torch.cuda.synchronize()
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


def _spy_plans(monkeypatch) -> list[bool]:
    """Whether each op implementation's call ran a native plan (`ops.NativePlans.run`), in order."""
    from autocuda.call import ops

    ran: list[bool] = []
    planned = ops.NativePlans.run
    monkeypatch.setattr(ops.NativePlans, "run", lambda *a: (lambda r: (ran.append(r is not None), r)[1])(planned(*a)))
    return ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec", ["lif", "alif"])
def test_compiled_calls_run_the_ops_plans_and_equal_the_python_launch(spec, dtype, monkeypatch):
    """torch.compile (Inductor) calls the ops through the dispatcher: their implementations run one-launch native
    plans (`ops.NativePlans`), bitwise the Python launch's outputs and gradients, also in a captured CUDA graph."""
    x = (torch.rand(6, 4097, device=CUDA) * 2).to(dtype)
    weights = torch.arange(1, 7, device=CUDA, dtype=dtype).view(-1, 1)

    def train(x: torch.Tensor) -> list[torch.Tensor]:
        x = x.clone().requires_grad_()
        spikes, finals, seqs = F.multi_step(spec, x, store_state_seq=True)
        loss = (spikes * weights).float().sum() + finals[0].float().sum() + seqs[0].float().mean()
        return [spikes, *finals, *seqs, *torch.autograd.grad(loss, x)]

    compiled = torch.compile(train, fullgraph=False)
    monkeypatch.setattr(native, "USE", False)
    want = compiled(x)
    monkeypatch.setattr(native, "USE", True)
    ran = _spy_plans(monkeypatch)
    for _ in range(2):
        got = compiled(x)
        assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert ran and all(ran), ran
    # a direct op call in a captured CUDA graph: the plan an uncaptured call made runs, its launch captured
    call = program.Call(spec, x, (4097,), [], None, False, None, None, {})
    initial, scalars = [float(s) for s in call.states], [float(v) for v in call.program.scalar_values(call.values)]

    def forward() -> list[torch.Tensor]:
        return torch.ops.autocuda.neuron_forward(call.key, x, [], initial, [], scalars, False, False, True, [])

    expected = forward()
    ran.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = forward()
    graph.replay()
    torch.cuda.synchronize()
    assert ran == [True] and all(torch.equal(o, e) for o, e in zip(outputs, expected, strict=True))


def test_a_second_backward_through_the_native_node_raises_torchs_error_on_the_gpu():
    """The node's saved variables drop their data at the first backward and stay: a second one raises torch's
    error (an emptied list once let the node read past the tensors it built: a crash)."""
    for _ in range(3):  # a training program's native plan is made at its call after the first backward
        x = (torch.rand(4, 300, device=CUDA) * 2).requires_grad_()
        spikes = F.multi_step("lif", x)[0]
        spikes.sum().backward()
    assert "NeuronCall" in spikes.grad_fn.name()
    with pytest.raises(RuntimeError, match="second time"):
        spikes.sum().backward()


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_a_checkpointed_layer_recomputes_through_its_native_plan_on_the_gpu(step_mode):
    """torch.utils.checkpoint around a layer reset inside it: the call that makes the native plan and the keyed
    recomputation save tensors of one shape (`Call.as_keyed`), so the gradients are those without checkpointing."""
    import torch.utils.checkpoint

    from autocuda import nn as ann

    layer = ann.ParametricLIFNode(step_mode=step_mode).to(CUDA)
    x0 = torch.rand(4, 2, 300, device=CUDA) * 2

    def spikes(x: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(x) if step_mode == "m" else torch.stack([layer(step) for step in x])

    found = []
    for checkpointed in (False, True, True, True):  # the plan is made within the checkpointed iterations
        layer.w.grad = None
        x = x0.clone().requires_grad_()
        out = torch.utils.checkpoint.checkpoint(spikes, x, use_reentrant=False) if checkpointed else spikes(x)
        out.sum().backward()
        found.append((x.grad, layer.w.grad))
    for got in found[1:]:
        assert torch.equal(got[0], found[0][0]) and torch.equal(got[1], found[0][1])
