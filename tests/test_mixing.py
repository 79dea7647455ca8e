"""The mixing kernels of the parallel spiking neurons (`autocuda.call.mixing`, `codegen.mixing_kernel`), run on the
CPU through the host runner, against SpikingJelly's composition (`torch.addmm`, then the surrogate) in the compute
dtype: the same spikes, and the gradients of x, the weights and the biases; where the kernels do not run a call,
`fire` says so (None) and the layers compose torch ops."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched
from conftest import deterministic_algorithms as deterministic

from autocuda.call import mixing
from autocuda.codegen.mixing_kernel import FUSED_STEPS, MAX_STEPS, PAIRED_MAX_STEPS, mixing_kernels, weight_chunk_bytes
from autocuda.nn import PSN, MaskedPSN, SlidingPSN
from autocuda.spec.surrogate import ATan, Sigmoid

F64 = torch.float64
# the gradients' tolerance relative to their norm: the kernels round grad_h to the rows' dtype once, torch's
# composition rounds each formula's step in it
TOLERANCE = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def composed(rows, weight, bias, surrogate):
    compute = torch.float32 if rows.dtype in (torch.float16, torch.bfloat16) else rows.dtype
    h = torch.addmm(bias.to(compute).reshape(-1, 1), weight.to(compute), rows.to(compute))
    return surrogate(h).to(rows.dtype)


def inputs(steps, neurons, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = (torch.randn(steps, neurons, generator=g, dtype=F64) * 1.5).to(dtype).requires_grad_()
    weight = torch.randn(steps, steps, generator=g, dtype=F64).requires_grad_()
    bias = torch.randn(steps, 1, generator=g, dtype=F64).requires_grad_()
    return rows, weight, bias


def gradients(out, wrt, seed=1):
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(out.dtype)
    return torch.autograd.grad((out * weights).sum(), wrt)


# every dtype, both surrogates in a tight and a half dtype, one step, no neurons, beyond FUSED_STEPS; an odd number
# of neurons (a neuron a thread) and an even one (two a thread, `mixing.word_lanes`, but in float64)
CASES = [(torch.float64, 8, 37, ATan()), (torch.float32, 8, 37, Sigmoid(alpha=2.5)), (torch.float16, 8, 37, ATan()),
         (torch.bfloat16, 8, 37, Sigmoid(alpha=2.5)), (torch.float64, 1, 5, Sigmoid(alpha=2.5)),
         (torch.float32, 3, 0, ATan()), (torch.float32, FUSED_STEPS + 1, 37, ATan()),
         (torch.float32, 8, 36, ATan()), (torch.float16, 6, 36, Sigmoid(alpha=2.5)), (torch.bfloat16, 8, 36, ATan()),
         (torch.float32, FUSED_STEPS + 1, 36, Sigmoid(alpha=2.5)), (torch.float64, 3, 36, ATan())]


@pytest.fixture(params=["fused", "deterministic"])
def backward(request):
    """The backward kernel: the fused one (the weights' and biases' gradients summed in the kernel) where T allows,
    or, under torch's deterministic algorithms, the one writing grad_h (the sums by torch)."""
    with deterministic(request.param == "deterministic"):
        yield request.param


def _fire_and_gradients(steps: int, dtype: torch.dtype, surrogate, fused: bool = True, neurons: int = 3) -> None:
    rows, weight, bias = inputs(steps, neurons, dtype)
    with deterministic(not fused):
        gradients(mixing.fire(rows, weight, bias, surrogate, backend="host"), (rows, weight, bias))


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The forward and backward kernels of the calls below (a kernel per steps, dtype and surrogate, both backward
    kernels of each case), compiled up front many to a compiler run (`conftest.compile_launched`): the calls would
    compile them one a run."""
    runs = [(steps, dtype, surrogate, fused, max(neurons, 1)) for dtype, steps, neurons, surrogate in CASES
            for fused in (True, False)]
    runs += [(4, F64, ATan(alpha=2.0)), (4, F64, ATan(alpha=5.0)), *((steps, F64, ATan()) for steps in (2, 3, 4, 5)),
             (2, F64, ATan(), False), (4, F64, ATan(), False)]
    return compile_launched(*(functools.partial(_fire_and_gradients, *run) for run in runs))


@pytest.mark.parametrize(("dtype", "steps", "neurons", "surrogate"), CASES,
                         ids=[f"{str(c[0])[6:]}-T{c[1]}-N{c[2]}-{c[3].name}" for c in CASES])
def test_the_kernels_equal_the_composition(dtype, steps, neurons, surrogate, backward):
    rows, weight, bias = inputs(steps, neurons, dtype)
    got = mixing.fire(rows, weight, bias, surrogate, backend="host")
    want = composed(rows, weight, bias, surrogate)
    assert got is not None and got.dtype == dtype and torch.equal(got, want)
    for g, w in zip(gradients(got, (rows, weight, bias)), gradients(want, (rows, weight, bias))):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert (g.double() - w.double()).norm() <= TOLERANCE[dtype] * w.double().norm() + 1e-30


def test_a_surrogate_changed_after_a_call_takes_new_kernels():
    rows, weight, bias = inputs(4, 9, F64)
    surrogate = ATan(alpha=2.0)
    first = gradients(mixing.fire(rows, weight, bias, surrogate, backend="host"), (rows,))[0]
    surrogate.alpha = 5.0
    again = gradients(mixing.fire(rows, weight, bias, surrogate, backend="host"), (rows,))[0]
    want = gradients(composed(rows, weight, bias, surrogate), (rows,))[0]
    assert not torch.allclose(first, again) and torch.allclose(again, want, rtol=1e-12, atol=1e-15)


def test_a_zero_dimensional_bias_is_every_steps():
    rows, weight, _ = inputs(5, 7, F64)
    bias = torch.tensor(-0.25, dtype=F64, requires_grad=True)
    got = mixing.fire(rows, weight, bias, ATan(), backend="host")
    want = composed(rows, weight, bias.expand(5), ATan())
    assert torch.equal(got, want)
    assert torch.allclose(gradients(got, (bias,))[0], gradients(want, (bias,))[0], rtol=1e-12)


@pytest.mark.parametrize("case", ["too many steps", "primitive surrogate", "not a surrogate", "cpu without host",
                                  "weight of another size", "weight on another device"])
def test_calls_the_kernels_do_not_run_get_none(case):
    rows, weight, bias = inputs(4, 3, torch.float32)
    surrogate, backend = ATan(), "host"
    if case == "too many steps":
        rows, weight, bias = inputs(MAX_STEPS + 1, 3, torch.float32)
    elif case == "primitive surrogate":
        surrogate = ATan(spiking=False)
    elif case == "not a surrogate":
        surrogate = torch.nn.ReLU()
    elif case == "cpu without host":
        backend = None
    elif case == "weight on another device":
        weight = weight.to("meta")
    else:
        weight = weight[:3, :3]
    assert mixing.fire(rows, weight, bias, surrogate, backend=backend) is None


@pytest.mark.parametrize(("steps", "itemsize", "chunk"), [(8, 4, 16), (6, 4, 8), (3, 4, 4), (1, 4, 4), (8, 8, 16),
                                                    (5, 8, 8)])
def test_the_weights_are_read_in_the_widest_vector_a_row_allows(steps, itemsize, chunk):
    assert weight_chunk_bytes(steps, itemsize) == chunk
    kernel = mixing_kernels(steps, "float32" if itemsize == 4 else "float64", ATan().frozen())[0]
    assert kernel.chunk_bytes == chunk
    assert ("reinterpret_cast" in kernel.full_codes) == (chunk > itemsize)


def test_a_tensor_is_aligned_by_a_copy_where_it_is_not():
    store = torch.arange(20, dtype=torch.float32)
    assert mixing.aligned(store, 16) is store
    view = store[1:17]
    copy = mixing.aligned(view, 16)
    assert view.data_ptr() % 16 and copy.data_ptr() % 16 == 0 and torch.equal(copy, view)


def test_weights_and_biases_at_an_unaligned_offset(backward, monkeypatch):
    """Weights and biases in the compute dtype that are views into another tensor, at an offset the kernels'
    vector reads do not allow, reach every kernel as an aligned copy (a GPU refuses a misaligned vector read; the
    host's processor does not), with the composition's spikes and gradients."""
    launched = []
    original = mixing.launch_per_neuron

    def recorded(kernel, args, *more, **options):
        launched.append([args[name].data_ptr() % kernel.chunk_bytes for name in ("weight", "bias")])
        return original(kernel, args, *more, **options)

    monkeypatch.setattr(mixing, "launch_per_neuron", recorded)
    rows, weight, bias = inputs(8, 37, torch.float32)
    store = torch.zeros(1 + 64 + 8, dtype=torch.float32)
    with torch.no_grad():
        store[1:65], store[65:] = weight.flatten(), bias.flatten()
    store.requires_grad_()
    w, b = store[1:65].view(8, 8), store[65:].view(8, 1)
    assert w.data_ptr() % 16 and b.data_ptr() % 16
    got = mixing.fire(rows, w, b, ATan(), backend="host")
    want = composed(rows, w, b, ATan())
    assert torch.equal(got, want)
    for g, expected in zip(gradients(got, (rows, store)), gradients(want, (rows, store))):
        assert (g.double() - expected.double()).norm() <= TOLERANCE[torch.float32] * expected.double().norm()
    assert launched == [[0, 0], [0, 0]]  # the forward kernel and a backward one


def test_the_kernels_are_built_once_per_steps_dtype_and_surrogate():
    first = mixing_kernels(4, "float32", ATan().frozen())
    assert mixing_kernels(4, "float32", ATan().frozen()) is first
    assert mixing_kernels(4, "float32", ATan(alpha=3.0).frozen())[0].kernel_name != first[0].kernel_name
    with pytest.raises(ValueError, match="T must be in"):
        mixing_kernels(MAX_STEPS + 1, "float32", ATan().frozen())


@pytest.mark.parametrize("layer", [lambda: PSN(T=6), lambda: MaskedPSN(k=2, T=6, lambda_init=0.5, step_mode="m"),
                                   lambda: SlidingPSN(k=3, step_mode="m")], ids=["PSN", "MaskedPSN", "SlidingPSN"])
def test_the_layers_take_the_kernels_where_they_run(layer, monkeypatch):
    """On the host runner (as on a GPU, where they run by default), a layer's multi-step call goes through the
    kernels and equals its composition, gradients of every parameter included."""
    torch.manual_seed(0)
    ours = layer().to(F64)
    x = (torch.randn(6, 4, 5, dtype=F64) * 1.5).requires_grad_()
    original, ran = mixing.fire, []

    def on_host(x_seq, weight, bias, surrogate, backend=None):
        ran.append(x_seq.shape)
        return original(x_seq, weight, bias, surrogate, backend="host")

    monkeypatch.setattr(mixing, "fire", on_host)
    got = ours(x)
    got_grads = gradients(got, (x, *ours.parameters()))
    monkeypatch.setattr(mixing, "fire", lambda *args, **kwargs: None)
    want = ours(x)
    want_grads = gradients(want, (x, *ours.parameters()))
    assert ran == [(6, 4, 5)] and torch.equal(got, want)
    for g, w in zip(got_grads, want_grads):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("given", ["broadcast from a sum", "transposed"])
def test_a_gradient_is_read_through_its_strides(given):
    rows, weight, bias = inputs(4, 9, F64)
    got = mixing.fire(rows, weight, bias, ATan(), backend="host")
    want = composed(rows, weight, bias, ATan())
    grad = torch.ones((), dtype=F64).expand(4, 9) if given.startswith("broadcast") else torch.randn(9, 4, dtype=F64).T
    for g, w in zip(torch.autograd.grad(got, (rows, weight, bias), grad),
                    torch.autograd.grad(want, (rows, weight, bias), grad)):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-14)


def test_the_weights_gradient_summed_in_chunks():
    """Without the fused kernel, float32 and float64 sum the weights' gradient in chunks of CHUNK neurons, and the
    rest after them."""
    rows, weight, bias = inputs(2, 2 * mixing.CHUNK + 5, F64)
    with deterministic(True):
        got = gradients(mixing.fire(rows, weight, bias, ATan(), backend="host"), (weight,))[0]
    want = gradients(composed(rows, weight, bias, ATan()), (weight,))[0]
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "deterministic"])
def test_each_backward_kernel_runs_where_it_should(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused backward kernel for T up to FUSED_STEPS (no grad_h, no matrix product); the kernel writing grad_h
    and torch's matrix product beyond it and under torch's deterministic algorithms (the fused kernel's atomics add
    in any order)."""
    launched = []
    original = mixing.launch_per_neuron
    monkeypatch.setattr(mixing, "launch_per_neuron", lambda kernel, *a, **k: launched.append(kernel.kernel_name)
                        or original(kernel, *a, **k))
    for steps in (4, FUSED_STEPS + 1):
        rows, weight, bias = inputs(steps, 3, F64)
        with deterministic(not fused):
            gradients(mixing.fire(rows, weight, bias, ATan(), backend="host"), (rows, weight, bias))
    backward = [name for name in launched if "backward" in name]
    assert [name.endswith("_fused") for name in backward] == [fused, False]


def test_a_second_derivative_through_the_kernels_is_refused():
    """The backward kernel is differentiable once: a second derivative raises rather than miss its terms."""
    rows, weight, bias = inputs(3, 4, F64)
    grad_x, = torch.autograd.grad(mixing.fire(rows, weight, bias, ATan(), backend="host").sum(), rows,
                                  create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative"):  # a gradient penalty
        ((grad_x ** 2).sum() + (rows ** 2).sum()).backward()


def test_a_thread_takes_two_neurons_where_the_rows_allow():
    assert mixing.word_lanes(torch.zeros(4, 6)) == 2
    assert mixing.word_lanes(torch.zeros(4, 6, dtype=torch.bfloat16)) == 2
    assert mixing.word_lanes(torch.zeros(4, 5)) == 1  # a row's length odd
    assert mixing.word_lanes(torch.zeros(25)[1:].view(4, 6)) == 1  # at an offset no pair is aligned to
    assert mixing.word_lanes(torch.zeros(4, 6, dtype=F64)) == 1  # float64: one neuron a thread
    assert mixing.word_lanes(torch.zeros(PAIRED_MAX_STEPS, 6)) == 2
    assert mixing.word_lanes(torch.zeros(PAIRED_MAX_STEPS + 1, 6)) == 1  # longer: one neuron a thread


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_neurons_a_thread_give_one_neurons_values(dtype, backward, monkeypatch):
    """Rows of an even length at an aligned address go two neurons to a thread (a word of two per access), the same
    rows at an odd offset one neuron a thread: the same spikes and grad_x bit for bit (each neuron's sums run in
    one order), the weights' and biases' gradients within rounding (summed over the neurons in another order)."""
    launched = []
    original = mixing.launch_per_neuron

    def recorded(kernel, args, *more, **options):
        launched.append((kernel.lanes, args["numel"]))
        return original(kernel, args, *more, **options)

    monkeypatch.setattr(mixing, "launch_per_neuron", recorded)
    rows, weight, bias = inputs(8, 36, dtype)
    store = torch.zeros(1 + rows.numel(), dtype=dtype)
    with torch.no_grad():
        store[1:] = rows.flatten()
    shifted = store[1:].view(8, 36).requires_grad_()
    paired = mixing.fire(rows, weight, bias, ATan(), backend="host")
    paired_grads = gradients(paired, (rows, weight, bias))
    single = mixing.fire(shifted, weight, bias, ATan(), backend="host")
    single_grads = gradients(single, (shifted, weight, bias))
    assert launched == [(2, 18), (2, 18), (1, 36), (1, 36)]
    assert torch.equal(paired, single) and torch.equal(paired_grads[0], single_grads[0])
    for got, want in zip(paired_grads[1:], single_grads[1:]):  # float sums of 36 terms in another order
        assert (got - want).norm() <= 1e-6 * want.norm()
