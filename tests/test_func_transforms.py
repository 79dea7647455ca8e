"""torch.func's transforms (grad, vmap) over the layers: the reference backend and the torch paths of SlidingPSN, the
DSR nodes and BatchNormNeuron run under them and agree with autograd and with a loop over the batch; the kernel
backends refuse them by name (docs/bad-input.md, Gradients). torch.jit.trace likewise; torch.export takes the
kernels; torch.utils.checkpoint recomputes a layer right where its function resets it or it keeps no states."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from autocuda import nn as ann
from autocuda.call import functional as F

F64 = torch.float64


def inputs(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator, dtype=F64) * 2.5 - 0.5


# (the layer, made in float64; x's shape; x's scale: every layer spikes)
LAYERS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...], float]] = {
    "LIFNode": (lambda: ann.LIFNode(step_mode="m", backend="reference"), (5, 2, 3), 1.0),
    "ParametricLIFNode": (lambda: ann.ParametricLIFNode(step_mode="m", backend="reference"), (5, 2, 3), 1.0),
    "IzhikevichNode s": (lambda: ann.IzhikevichNode(backend="reference"), (2, 3), 40.0),
    "SlidingPSN": (lambda: ann.SlidingPSN(3, step_mode="m"), (5, 2, 3), 1.0),
    "DSRLIFNode": (lambda: ann.DSRLIFNode(T=5, step_mode="m"), (5, 2, 3), 4.0),
    "BatchNormNeuron eval": (lambda: ann.BatchNormNeuron(2, step_mode="m").eval(), (5, 2, 2, 3, 3), 1.0),
    "BatchNormNeuron no running statistics": (
        lambda: ann.BatchNormNeuron(2, step_mode="m", track_running_stats=False), (5, 2, 2, 3, 3), 1.0),
}


def made(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    make, shape, scale = LAYERS[name]
    torch.manual_seed(0)
    return make().to(F64), inputs(*shape) * scale


def loss_of(layer: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def loss(x: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return (layer(x) * torch.linspace(0.5, 1.5, x.shape[-1], dtype=F64)).sum()
    return loss


@pytest.mark.parametrize("name", list(LAYERS))
def test_grad_equals_autograd(name):
    layer, x = made(name)
    got = torch.func.grad(loss_of(layer))(x)
    x = x.clone().requires_grad_()
    loss_of(layer)(x).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", list(LAYERS))
def test_vmap_equals_a_loop(name):
    layer, x = made(name)
    batch = torch.stack([x, x.flip(-1), x * 0.5])
    def run(u: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(u)
    got = torch.vmap(run)(batch)
    expected = torch.stack([run(u) for u in batch])
    assert expected.abs().sum() > 0
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_a_learnable_parameter_takes_grad_through_functional_call():
    layer, x = made("ParametricLIFNode")
    params = {"w": torch.tensor(0.3, dtype=F64)}

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        layer.reset()
        return torch.func.functional_call(layer, p, (x,)).sum()
    got = torch.func.grad(loss)(params)["w"]
    with torch.no_grad():
        layer.w.fill_(0.3)
    layer.reset()
    layer(x).sum().backward()
    assert got != 0
    torch.testing.assert_close(got, layer.w.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_the_kernels_refuse_the_transforms_by_name(transform, step_mode):
    layer = ann.LIFNode(step_mode=step_mode, backend="host")
    x = inputs(5, 3) if step_mode == "m" else inputs(3)
    run = torch.func.grad(loss_of(layer)) if transform == "grad" else torch.vmap(loss_of(layer))
    message = (r"^neuron 'lif': autocuda's kernels \(backend 'host'\) do not run under torch.func transforms .* "
               r"backend='reference'")
    with pytest.raises(NotImplementedError, match=message):
        run(x if transform == "grad" else torch.stack([x, x]))
    with pytest.raises(NotImplementedError, match=message):  # the functional API alike
        torch.vmap(lambda u: F.multi_step("lif", u, backend="host")[0])(torch.stack([inputs(5, 3)] * 2))
    layer.reset()
    assert layer(x).shape == x.shape  # outside the transform the layer runs as before


def test_batchnorm_training_with_running_statistics_refuses_vmap():
    layer, x = made("BatchNormNeuron eval")
    layer.train()
    with pytest.raises(RuntimeError, match=r"^BatchNormNeuron: under torch.vmap a training call would update the "
                                           r"running statistics"):
        torch.vmap(loss_of(layer))(torch.stack([x, x]))


def test_the_mixing_kernels_leave_a_transformed_call_to_torch():
    """PSN's kernels (asked for by name here; a GPU's default) step aside under a transform: torch composes the
    call, so a PSN on a GPU runs under grad and vmap as on the CPU (tests/gpu/test_func_transforms_gpu.py)."""
    from autocuda.call import mixing
    from autocuda.spec.surrogate import ATan

    x, weight, bias = inputs(4, 3), torch.eye(4, dtype=F64), torch.zeros(4, 1, dtype=F64)
    assert mixing.kernel_backend(x, "host") == "host"
    seen = []
    torch.vmap(lambda u: seen.append(mixing.kernel_backend(u, "host")) or u)(torch.stack([x, x]))
    torch.func.grad(lambda u: seen.append(mixing.fire(u, weight, bias, ATan(), "host")) or u.sum())(x)
    assert seen == [None, None]


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_jit_trace_refuses_the_kernels_and_records_the_reference(step_mode):
    """torch.jit.trace records no kernel launch (its trace returned the tracing call's outputs): refused by name,
    also after calls that took the layer's keyed path; the reference's torch ops trace and run as eager."""
    x = (inputs(5, 2, 3) if step_mode == "m" else inputs(2, 3)) * 3
    layer = ann.LIFNode(step_mode=step_mode, backend="host")
    layer(x)
    layer(x)
    layer.reset()
    with pytest.raises(NotImplementedError, match=r"^neuron 'lif': autocuda's kernels \(backend 'host'\) cannot be "
                                                  r"recorded by torch.jit.trace"):
        torch.jit.trace(layer, (x,), check_trace=False)
    layer.backend = "reference"
    layer.reset()
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    other = inputs(*x.shape, seed=1) * 3
    layer.reset()
    expected = layer(other)
    layer.reset()
    assert expected.abs().sum() > 0
    assert torch.equal(traced(other), expected)


@pytest.mark.filterwarnings("ignore:The tensor attribute self.v was assigned during export")
def test_torch_export_takes_the_kernels():
    """torch.export records the kernels as custom ops: the exported program runs them on new inputs."""
    layer = ann.LIFNode(step_mode="m", backend="host")
    x, other = inputs(5, 2, 3), inputs(5, 2, 3, seed=1)
    exported = torch.export.export(layer, (x,))
    layer.reset()
    expected = layer(other)
    assert expected.abs().sum() > 0
    assert torch.equal(exported.module()(other), expected)


@pytest.mark.filterwarnings("ignore:The tensor attribute self.v was assigned during export")
def test_a_saved_export_loads_and_runs(tmp_path):
    """torch.export.save and load round-trip a layer with a learnable parameter; a process that has not run the
    configuration is told to (docs/quickstart.md, Exporting)."""
    from autocuda.runtime import configs

    torch.manual_seed(0)
    layer = ann.ParametricLIFNode(step_mode="m", backend="host").to(F64)
    x, other = inputs(5, 2, 3) * 2, inputs(5, 2, 3, seed=1) * 2
    torch.export.save(torch.export.export(layer, (x,)), tmp_path / "plif.pt2")
    loaded = torch.export.load(tmp_path / "plif.pt2")
    layer.reset()
    expected = layer(other)
    assert expected.abs().sum() > 0
    assert torch.equal(loaded.module()(other), expected)
    with pytest.raises(KeyError, match=r"no call of this process ran its configuration; call the layer"):
        configs.config("lif_0123456789abcdef")


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_sliding_psn_traces():
    """Its band's Function took T as the tracer's traced size, which failed in torch ('unordered_map::at')."""
    torch.manual_seed(0)
    layer = ann.SlidingPSN(3, step_mode="m").to(F64)
    x, other = inputs(5, 2, 3), inputs(5, 2, 3, seed=1)
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    expected = layer(other)
    assert expected.abs().sum() > 0
    assert torch.equal(traced(other), expected)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("how", ["reset inside", "no final states"])
def test_checkpoint_recomputes_a_layer_that_starts_afresh(how, use_reentrant):
    """torch.utils.checkpoint runs the function again in backward: right where that run starts from the first's
    initial states (docs/bad-input.md, Module state between calls)."""
    from torch.utils.checkpoint import checkpoint

    x = inputs(5, 2, 3) * 2
    plain = x.clone().requires_grad_()
    ann.LIFNode(step_mode="m", backend="host")(plain).sum().backward()
    layer = ann.LIFNode(step_mode="m", backend="host")
    if how == "no final states":
        layer.store_final_states = False

    def run(u: torch.Tensor) -> torch.Tensor:
        if how == "reset inside":
            layer.reset()
        return layer(u)
    checkpointed = x.clone().requires_grad_()
    checkpoint(run, checkpointed, use_reentrant=use_reentrant).sum().backward()
    assert plain.grad is not None and plain.grad.abs().sum() > 0
    assert torch.equal(checkpointed.grad, plain.grad)


@pytest.mark.filterwarnings("ignore:The tensor attribute")
def test_a_layer_runs_eagerly_after_it_was_exported():
    """torch.export runs the layer's code on fake tensors: SlidingPSN's memo of its band kept one, and every later
    eager call returned a FakeTensor (no data). The memos now keep plain tensors only."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autocuda.base.tensor_cache import tensor_cache

    torch.manual_seed(0)
    layer = ann.SlidingPSN(3, step_mode="m").to(F64)
    x = inputs(6, 2, 3)
    torch.export.export(layer, (x,))
    out = layer(x)
    assert type(out) is torch.Tensor and out.abs().sum() > 0

    made = []
    table = tensor_cache(maxsize=4)(lambda n: made.append(n) or torch.arange(n))
    with FakeTensorMode():
        table(3)
    assert type(table(3)) is torch.Tensor and table(3).tolist() == [0, 1, 2]
    assert made == [3, 3]  # the fake one was not kept; the real one is


@pytest.mark.filterwarnings("ignore:The tensor attribute self.v was assigned during export")
@pytest.mark.parametrize("save_h", [True, False])
def test_an_export_with_a_dynamic_time_and_batch_runs_any_shape(save_h):
    """The op's fake kernel asked the layout of the call's T even where no output's shape depends on it: an export
    told that T varies failed ('Constraints violated (T)')."""
    from torch.export import Dim

    layer = ann.LIFNode(step_mode="m", backend="host")
    layer.save_h = save_h
    dims = {0: Dim("T", min=2, max=64), 1: Dim("B", min=2, max=64)}
    exported = torch.export.export(layer, (inputs(5, 2, 3),), dynamic_shapes=((dims,),)).module()
    for shape in ((9, 4, 3), (2, 2, 3), (40, 3, 3)):
        x = inputs(*shape) * 2
        layer.reset()
        expected = layer(x)
        assert expected.abs().sum() > 0
        assert torch.equal(exported(x), expected), shape


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_forward_mode_ad_through_the_reference_and_refused_by_the_kernels(step_mode):
    """Forward mode (forward_ad's dual tensors, torch.func.jvp) gives the reference's Jacobian-vector product, the
    surrogate's derivative as backward's; the kernels dropped the tangent silently (no autograd node where nothing
    requires grad) and now refuse a dual input by name, while a plain input under a dual level runs."""
    import torch.autograd.forward_ad as forward_ad

    x = inputs(5, 3) * 2 if step_mode == "m" else inputs(3) * 3
    tangent = inputs(*x.shape, seed=1)
    layer = ann.ParametricLIFNode(step_mode=step_mode, backend="reference").to(F64)

    def run(u: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(u)
    jacobian = torch.autograd.functional.jacobian(run, x).reshape(x.numel(), x.numel())
    expected = (jacobian @ tangent.reshape(-1)).reshape(x.shape)
    assert expected.abs().sum() > 0
    with forward_ad.dual_level():
        dual = run(forward_ad.make_dual(x, tangent))
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.func.jvp(run, (x,), (tangent,))[1], expected, rtol=1e-12, atol=1e-14)

    layer.backend = "host"
    run(x), run(x)  # the layer's keyed call configured
    with forward_ad.dual_level():
        assert run(x).shape == x.shape
        with pytest.raises(NotImplementedError, match=r"^neuron 'parametric_lif': autocuda's kernels \(backend "
                                                      r"'host'\) carry no forward-mode tangents"):
            run(forward_ad.make_dual(x, tangent))
