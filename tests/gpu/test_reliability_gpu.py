"""Reliability on a GPU (issue 8), through the public API (autocuda.functional / autocuda.nn):

a. tensors past 2**31 elements (float16 T=2, N=1.2e9, forward and backward; N > 2**31 neurons, forward), checked
   against a float64 reference computed on sampled neurons only, near the end of the flat range included;
b. two runs give bitwise-identical outputs and gradients (learnable per-channel parameters included);
c. streams: kernels wait for a slow producer on torch's current (side) stream, backward included; the forward and
   backward hot paths never synchronise the device (torch's sync debug mode);
d. a second GPU: tensors on cuda:1 while cuda:0 is current, and a layer moved to cuda:1; mixed devices refused;
e. DistributedDataParallel over two GPUs (tests/gpu/ddp_step.py under torchrun) gives the single-process gradients.

Memory: the largest test holds about 34 GB at its peak (they run one after another and free what they allocate).
"""
from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import deterministic_algorithms

from autocuda import nn as ann
from autocuda.call import functional as F

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F16, F32, F64 = torch.float16, torch.float32, torch.float64
REPO = Path(__file__).resolve().parents[2]
DEVICES = torch.cuda.device_count()
two_gpus = pytest.mark.skipif(DEVICES < 2, reason=f"needs 2 GPUs, torch.cuda.device_count() is {DEVICES}")
SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: ~50 ms of a spinning kernel at 2 GHz
LIMIT = 2**31               # elements past this flat offset overflow 32-bit signed indices


@pytest.fixture
def release():
    """Give the memory of a big test back to the device before the next one."""
    yield
    gc.collect()
    torch.cuda.empty_cache()


def need_memory(gigabytes: float) -> None:
    free, _ = torch.cuda.mem_get_info()
    if free < gigabytes * 1e9:
        pytest.skip(f"needs {gigabytes:g} GB of free GPU memory, {free / 1e9:.1f} GB free")


# -- a. past 2**31 elements ---------------------------------------------------------------------------------------
def _sample(n: int, around: int, generator: torch.Generator) -> torch.Tensor:
    """Neuron indices: the first and last 256, 256 around `around`, 256 at random."""
    parts = [torch.arange(0, 256), torch.arange(n - 256, n), torch.arange(around - 128, around + 128),
             torch.randint(0, n, (256,), generator=generator)]
    return torch.cat(parts).clamp(0, n - 1).unique().to(CUDA)


def _lif_reference(x: torch.Tensor, weight_v: float) -> tuple[torch.Tensor, ...]:
    """float64 LIF (tau 2, hard reset to 0, threshold 1) on [T, k]: spikes, final v, grad x, and the distance of
    h to the threshold per step (for the ambiguity mask)."""
    x = x.detach().to(F64).requires_grad_()
    spikes, (v,), (v_seq,) = F.multi_step("lif", x, store_state_seq=True, backend="reference")
    (grad_x,) = torch.autograd.grad((spikes, v), x, (torch.ones_like(spikes), torch.full_like(v, weight_v)))
    before = torch.cat([torch.zeros_like(v_seq[:1]), v_seq[:-1]]).detach()
    h = before + (x.detach() - before) / 2
    return spikes.detach(), v.detach(), grad_x, (h - 1).abs()


@pytest.mark.parametrize("n", [1_200_000_000, 1_200_000_001], ids=["vector-layout", "per-lane-layout"])
def test_lif_past_2_31_elements_forward_and_backward(n, release):
    """T * N = 2.4e9 > 2**31 float16 elements: x 4.8 GB; outputs, saved h, dense gradients: ~34 GB at the peak."""
    need_memory(40)
    steps = 2
    g = torch.Generator(device=CUDA).manual_seed(3)
    x = torch.empty(steps, n, dtype=F16, device=CUDA).uniform_(-0.5, 2.5, generator=g).requires_grad_()
    spikes, (v,), _ = F.multi_step("lif", x)
    one = torch.ones((), dtype=F16, device=CUDA)
    (grad_x,) = torch.autograd.grad((spikes, v), x, (one.expand(steps, n), (one / 2).expand(n)))
    crossing = LIMIT - n  # x[1, crossing] sits at flat offset 2**31
    idx = _sample(n, crossing, torch.Generator().manual_seed(4))
    got = [spikes[:, idx].double(), v[idx].double(), grad_x[:, idx].double()]
    x_small = x.detach()[:, idx]
    del x, spikes, v, grad_x
    torch.cuda.empty_cache()
    want_spikes, want_v, want_grad, distance = _lif_reference(x_small, 0.5)
    # float16 storage: backward recomputes spike and surrogate from h stored in float16 (see test_runtime_gpu)
    clean = (distance > 2e-3).all(0)
    assert clean.double().mean() > 0.9
    assert ((idx >= crossing) & clean).sum() > 300  # checked neurons whose t = 1 element lies past 2**31
    assert want_spikes[:, clean].sum() > 100 and (want_spikes[:, clean] == 0).sum() > 100
    assert torch.equal(got[0][:, clean], want_spikes[:, clean]), "spikes differ"
    torch.testing.assert_close(got[1][clean], want_v[clean].to(F16).double(), rtol=1e-3, atol=1e-3)
    scale = want_grad[:, clean].abs().max()
    torch.testing.assert_close(got[2][:, clean], want_grad[:, clean], rtol=1e-2, atol=1e-2 * float(scale))


def test_lif_with_more_than_2_31_neurons_forward(release):
    """N = 2**31 + 2**20 + 1 neurons in one step (the neuron index itself past 2**31): forward, float16, ~17 GB."""
    need_memory(24)
    n = LIMIT + 2**20 + 1
    g = torch.Generator(device=CUDA).manual_seed(5)
    x = torch.empty(1, n, dtype=F16, device=CUDA).uniform_(-0.5, 2.5, generator=g)
    with torch.no_grad():
        spikes, (v,), _ = F.multi_step("lif", x)
    idx = _sample(n, LIMIT, torch.Generator().manual_seed(6))
    got_spikes, got_v, x_small = spikes[:, idx].double(), v[idx], x[:, idx]
    del x, spikes, v
    torch.cuda.empty_cache()
    assert (idx >= LIMIT).sum() >= 256 + 128
    want_spikes, want_v, _, _ = _lif_reference(x_small, 0.0)
    # one step from v = 0: h = x / 2 is exact in float32 and float64, so both round alike
    assert torch.equal(got_spikes, want_spikes) and 0 < want_spikes.sum() < want_spikes.numel()
    assert torch.equal(got_v, want_v.to(F16))


# -- b. determinism -------------------------------------------------------------------------------------------------
SHAPE = (2, 4, 65536)   # [B, C, W]: N = 524288, wide enough for the vectorised layouts (4 fp32 / 8 fp16 per thread)


def _training_step(name: str, dtype: torch.dtype, per_neuron: bool = False) -> list[torch.Tensor]:
    """Outputs and every gradient (x, initial states, a per-channel learnable parameter) of one step.
    `per_neuron`: the parameter's values spread to one per neuron, so its gradient is each neuron's partial."""
    g = torch.Generator(device=CUDA).manual_seed(7)
    x = (torch.rand(8, *SHAPE, generator=g, device=CUDA) * 2).to(dtype).requires_grad_()
    compute = F32 if dtype != F64 else F64
    name_and_values = {"parametric_lif": ("w", (-1, 1)),
                       "alif": ("tau", (1.5, 4))}  # alif: tau per channel, learned though the spec makes it a scalar
    key, (low, high) = name_and_values[name]
    value = torch.linspace(low, high, 4, device=CUDA, dtype=compute).reshape(4, 1)
    params = {key: (value.expand(SHAPE).clone() if per_neuron else value).requires_grad_()}
    states = [(torch.rand(*SHAPE, generator=g, device=CUDA) * 0.5).to(dtype).requires_grad_()
              for _ in range(2 if name == "alif" else 1)]
    spikes, finals, seqs = F.multi_step(name, x, *states, store_state_seq=True, **params)
    outputs = [spikes, *finals, *seqs]
    weights = [torch.rand(o.shape, generator=g, device=CUDA).to(dtype) for o in outputs]
    grads = torch.autograd.grad(outputs, [x, *states, *params.values()], weights)
    return [o.detach() for o in outputs] + list(grads)




@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
@pytest.mark.parametrize("name", ["parametric_lif", "alif"])
def test_two_runs_are_bitwise_identical(name, dtype):
    """Under torch.use_deterministic_algorithms(True), every output and gradient, the per-channel parameter's
    included (read per neuron then, and summed by torch rather than with atomics)."""
    with deterministic_algorithms():
        first, second = _training_step(name, dtype), _training_step(name, dtype)
    assert first[0].sum() > 0 and first[-1].abs().sum() > 0  # spikes, and a learnable gradient
    for i, (a, b) in enumerate(zip(first, second)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output/gradient {i} differs between two runs"


@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
@pytest.mark.parametrize("name", ["parametric_lif", "alif"])
def test_per_channel_sums_agree_with_the_deterministic_path(name, dtype):
    """By default a per-channel parameter's gradient is summed per channel with atomics: outputs and the other
    gradients are bitwise those of the deterministic path, that gradient equal up to the order of its sum.

    The order's rounding is bounded by the sum of the terms' magnitudes, not by the sum (its terms have both
    signs): about 1e3 atomic additions per channel here, each of relative error 2**-24, so within 1e-4 of each
    channel's sum of |partials| (a neuron's partial is its own gradient when the parameter is one per neuron)."""
    fast = _training_step(name, dtype)
    with deterministic_algorithms():
        exact = _training_step(name, dtype)
        partials = _training_step(name, dtype, per_neuron=True)[-1]
    for i, (a, b) in enumerate(zip(fast[:-1], exact[:-1])):
        assert torch.equal(a, b), f"output/gradient {i} differs from the deterministic path"
    scale = partials.abs().sum(dim=(0, 2)).reshape(exact[-1].shape)
    error = (fast[-1] - exact[-1]).abs()
    assert (error <= 1e-4 * scale).all(), f"per-channel sums differ by {(error / scale).max().item():.2e} of the scale"


def test_two_runs_of_a_module_are_bitwise_identical():
    x = torch.rand(8, 2, 4, 4096, generator=torch.Generator().manual_seed(8)).to(CUDA) * 2

    def run() -> list[torch.Tensor]:
        plif = ann.ParametricLIFNode(step_mode="m").to(CUDA)
        alif = ann.ALIFNode(step_mode="m")
        out = alif(plif(x) * 3.0)  # ALIF (tau = 2) needs inputs above 2 to reach its threshold of 1
        out.sum().backward()
        return [out.detach(), plif.w.grad, plif.v, alif.v, alif.a]

    first, second = run(), run()
    assert first[0].sum() > 0 and first[1] != 0
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# -- c. streams and synchronisation ----------------------------------------------------------------------------------
def _lif_step(x: torch.Tensor, grad_spikes: torch.Tensor) -> list[torch.Tensor]:
    spikes, (v,), _ = F.multi_step("lif", x)
    (grad_x,) = torch.autograd.grad((spikes, v), x, (grad_spikes, torch.ones_like(v)))
    return [spikes.detach(), v.detach(), grad_x]


def test_kernels_wait_for_a_slow_producer_on_a_side_stream():
    """Inputs and output gradients are written on a side stream after ~50 ms of a spinning kernel there; the
    forward and backward kernels, launched right after without any synchronisation, must see them."""
    g = torch.Generator(device=CUDA).manual_seed(9)
    source, grad_source = torch.rand(16, 65536, generator=g, device=CUDA) * 2, torch.rand(16, 65536, generator=g,
                                                                                          device=CUDA)
    expected = _lif_step(source.clone().requires_grad_(), grad_source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros_like(source)
        torch.cuda._sleep(SLEEP_CYCLES)   # a long producer on this stream
        x.copy_(source)
        grad_spikes = torch.zeros_like(grad_source)
        spikes, (v,), _ = F.multi_step("lif", x.requires_grad_())
        torch.cuda._sleep(SLEEP_CYCLES)
        grad_spikes.copy_(grad_source)
        (grad_x,) = torch.autograd.grad((spikes, v), x, (grad_spikes, torch.ones_like(v)))
        got = [spikes.detach().clone(), v.detach().clone(), grad_x.clone()]  # consumers on the same stream
    side.synchronize()
    assert expected[0].sum() > 0
    for what, a, b in zip(("spikes", "v", "grad x"), got, expected):
        assert torch.equal(a, b), f"{what} differ: a kernel did not run on the side stream"


def test_forward_and_backward_never_synchronise_the_device():
    """No .item(), no host copies on the hot path: torch's sync debug mode turns any synchronising call into an
    error (kernels are compiled in a first, unchecked call)."""
    torch.manual_seed(10)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), ann.LIFNode(step_mode="m"), torch.nn.Linear(64, 32),
                              ann.ParametricLIFNode(step_mode="m"), ann.ALIFNode(step_mode="m")).to(CUDA)
    x = torch.rand(8, 4, 16, device=CUDA) * 3

    def step() -> None:
        for module in net.modules():
            if isinstance(module, ann.Neuron):
                module.reset()
        net(x).sum().backward()
        net[1].step_mode = "s"
        net[1].reset()
        net[1](x[0] @ torch.ones(16, 64, device=CUDA)).sum()  # single step, no grad needed
        net[1].step_mode = "m"

    step()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()


# -- d. a second device, mixed devices ------------------------------------------------------------------------------
def test_mixed_devices_are_refused_by_name():
    x = torch.rand(3, 4, device=CUDA)
    with pytest.raises(ValueError, match=rf"^state 'v': on cpu, but the input is on {x.device}$"):
        F.multi_step("lif", x, torch.zeros(4))
    with pytest.raises(ValueError, match=rf"^parameter 'tau': on cpu, but the input is on {x.device}$"):
        F.multi_step("lif", x, tau=torch.full((4,), 2.0))
    with pytest.raises(ValueError, match=rf"^state 'v': on {x.device}, but the input is on cpu$"):
        F.single_step("lif", x[0].cpu(), torch.zeros(4, device=CUDA))
    node = ann.LIFNode(step_mode="m")
    node(x.cpu())  # its state now lives on the CPU: not moved with the input (reset it when moving)
    with pytest.raises(ValueError, match=r"^state 'v': on cpu"):
        node(x)
    node.reset()
    assert node(x).device == x.device


def _on(device: torch.device, name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """float64 outputs and gradients of `name` with every tensor on `device` (kernels on CUDA, else the reference)."""
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(6, 3, 1000, generator=g, dtype=F64) * 2).to(device).requires_grad_()
    states = [(torch.rand(3, 1000, generator=g, dtype=F64) * 0.5).to(device).requires_grad_()
              for _ in range(2 if name == "izhikevich" else 1)]
    params = {"w": torch.tensor([[0.5], [-0.2], [1.0]], dtype=F64, device=device, requires_grad=True)} \
        if name == "parametric_lif" else {"a": 0.1, "b": 0.2} if name == "izhikevich" else {}
    spikes, finals, _ = F.multi_step(name, x, *states, **params)
    outputs = [spikes, *finals]
    leaves = [x, *states, *(p for p in params.values() if isinstance(p, torch.Tensor))]
    grads = torch.autograd.grad([o.sum() * (i + 1) for i, o in enumerate(outputs)], leaves)
    return [o.detach() for o in outputs], list(grads)


@two_gpus
@pytest.mark.parametrize("name", ["lif", "parametric_lif", "izhikevich"])
def test_second_device_matches_the_reference(name):
    torch.cuda.set_device(0)
    device = torch.device("cuda", 1)
    outputs, grads = _on(device, name)
    assert torch.cuda.current_device() == 0  # the call did not switch the current device
    assert all(t.device == device for t in outputs + grads)
    want_outputs, want_grads = _on(torch.device("cpu"), name)
    assert outputs[0].sum() > 0
    assert torch.equal(outputs[0].cpu(), want_outputs[0])
    for a, b in zip(outputs[1:] + grads, want_outputs[1:] + want_grads):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-10, atol=1e-12)


@two_gpus
def test_layer_moved_to_the_second_device():
    torch.cuda.set_device(0)
    device = torch.device("cuda", 1)
    x = torch.rand(6, 2, 3, 500, generator=torch.Generator().manual_seed(12), dtype=F64) * 2
    results = []  # float64 input (w, float32, is converted): no spike decided by rounding
    for where in (device, torch.device("cpu")):
        node = ann.ParametricLIFNode(init_tau=3.0, step_mode="m").to(where)
        xs = x.to(where).requires_grad_()
        out = node(xs)
        (out.sum() + node.v.sum()).backward()
        results.append([out.detach().cpu(), node.v.detach().cpu(), xs.grad.cpu(), node.w.grad.cpu()])
        assert out.device == node.v.device == node.w.grad.device == where
    assert results[0][0].sum() > 0
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:], results[1][1:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


@two_gpus
def test_second_device_follows_its_current_stream():
    device = torch.device("cuda", 1)
    source = torch.rand(16, 65536, generator=torch.Generator().manual_seed(13)).to(device) * 2
    expected = F.multi_step("lif", source)[0]
    torch.cuda.synchronize(device)
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):
        x = torch.zeros_like(source)
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(source)
        got = F.multi_step("lif", x)[0].clone()
    side.synchronize()
    assert expected.sum() > 0 and torch.equal(got, expected)


# -- e. DistributedDataParallel -----------------------------------------------------------------------------------
DDP_SCRIPT = Path(__file__).with_name("ddp_step.py")


def _load_ddp_script():
    spec = importlib.util.spec_from_file_location("ddp_step", DDP_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@two_gpus
def test_ddp_over_two_gpus_gives_the_single_process_gradients(tmp_path):
    outfile = tmp_path / "ddp_grads.pt"
    env = os.environ | {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(DDP_SCRIPT), str(outfile)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    ddp = torch.load(outfile)
    assert ddp["world_size"] == 2
    script = _load_ddp_script()
    script.check_against_single_process(ddp, script.single_process_step(torch.device("cuda", 0)))
