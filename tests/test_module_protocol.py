"""The layers as torch.nn.Module citizens: hooks (on a layer, and on the modules a composite layer holds), calls with
the wrong arguments, torch.jit.script and torch.fx.symbolic_trace (refused by name, or a leaf of a Tracer that keeps
them), repr, a layer used twice in a network, parameters changed by optimizers, parametrizations and no_grad edits
after the fast paths ran. Each compared with what SpikingJelly's class or an unfused layer does."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from autocuda import nn as ann
from autocuda.tools.monitor import Monitor
from tests.backends import CPU_BACKENDS

sj_neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
sj_functional = pytest.importorskip("spikingjelly.activation_based.functional")


def _inputs(*shape: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# -- hooks -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_hooks_replace_inputs_and_outputs(backend):
    """Pre-hooks (plain and with_kwargs) replace the input and forward hooks the output, as on any module; a hook
    that raises leaves the layer callable, its states as before the call."""
    layer = ann.LIFNode(backend=backend)
    x = _inputs(4, 3)
    handle = layer.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    assert layer(x + 5).sum() == 0 and torch.equal(layer.v, torch.zeros(4, 3))
    handle.remove()
    handle = layer.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] * 0,), kwargs), with_kwargs=True)
    assert layer(x + 5).sum() == 0
    handle.remove()
    handle = layer.register_forward_hook(lambda m, args, kwargs, out: out + 10, with_kwargs=True)
    assert (layer(x) >= 10).all()
    handle.remove()
    v = layer.v

    def boom(module, args):
        raise RuntimeError("boom")

    handle = layer.register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        layer(x)
    handle.remove()
    assert layer.v is v
    with pytest.raises(TypeError, match=r"'lif' takes 1 step input\(s\) \(x\), one tensor each; got 2"):
        layer(x, x)
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        layer(x=x)


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_hooks_on_a_batchnorm_neurons_neuron_run(backend, step_mode):
    """BatchNormNeuron runs its neuron's kernels itself: hooks on the neuron (a Monitor's, a user's, from before
    fuse_batchnorm) never ran, and a Monitor of the network recorded nothing. With hooks the neuron is called on
    BatchNorm's output, as an unfused one: the hooks see it, and the spikes and states are the fused layer's."""
    torch.manual_seed(0)
    fused = ann.BatchNormNeuron(3, "if", backend=backend, step_mode=step_mode, dims=1).to(torch.float64)
    hooked = ann.BatchNormNeuron(3, "if", backend=backend, step_mode=step_mode, dims=1).to(torch.float64)
    x = (_inputs(4, 5, 3) if step_mode == "m" else _inputs(5, 3)).double() * 3
    seen, replaced = [], []
    hooked.neuron.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    hooked.neuron.register_forward_hook(lambda m, args, out: replaced.append(out))
    with Monitor(nn.Sequential(hooked)) as monitor:
        spikes = hooked(x)
    expected = fused(x)
    assert expected.sum() > 0
    assert torch.equal(spikes, expected) and torch.allclose(hooked.neuron.v, fused.neuron.v)
    assert len(seen) == 1 and replaced[0] is spikes
    dims = (0, 1) if step_mode == "m" else (0,)
    assert torch.allclose(seen[0].mean(dims), torch.zeros(3, dtype=torch.float64), atol=1e-12)  # BatchNorm's output
    assert len(monitor.records["0.neuron"]["spike"]) == 1
    hooked.neuron.register_forward_hook(lambda m, args, out: out * 0)
    assert hooked(x).sum() == 0


def test_hooks_on_an_ilc_nodes_connection_run():
    """The ILC nodes' feedback took conn's weight and bias directly, so hooks on `conn` never ran (SpikingJelly's
    call conn each step): a forward hook, or weight_norm's pre-hook that computes its weight."""
    torch.manual_seed(0)
    ours, theirs = ann.ILCIFNode(2, 3, backend="reference"), sj_neuron.ILCIFNode(2, 3)
    theirs.conn.load_state_dict(ours.conn.state_dict())
    x = _inputs(5, 4, 6, scale=1.5)
    assert torch.equal(ours(x), theirs(x))
    for node in (ours, theirs):
        node.conn.register_forward_hook(lambda m, args, out: out * 0 + 1.0)
    assert torch.equal(ours(x), theirs(x))
    assert not torch.equal(ours(x), ann.ILCIFNode(2, 3, backend="reference")(x))


# -- torch.jit.script and torch.fx -----------------------------------------------------------------------------
def _core(x, v):
    h = v + x
    s = (h >= 1.0).to(h.dtype)
    return s, h * (1.0 - s)


SCRIPTED = {
    "LIFNode": lambda: ann.LIFNode(),
    "izhikevich": lambda: ann.Neuron("izhikevich"),
    "FlexSN": lambda: ann.FlexSN(_core, 1),
    "PSN": lambda: ann.PSN(4),
    "SlidingPSN": lambda: ann.SlidingPSN(2),
    "BatchNormNeuron": lambda: ann.BatchNormNeuron(3, dims=1),
    "in a Sequential": lambda: nn.Sequential(nn.Linear(3, 3), ann.LIFNode()),
    "NonSpikingBaseNode": lambda: ann.NonSpikingBaseNode(),
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script's own
@pytest.mark.parametrize("make", SCRIPTED.values(), ids=SCRIPTED.keys())
def test_jit_script_is_refused_by_name(make):
    """torch.jit.script failed on a type annotation ("Unknown type annotation: 'str'"); it is refused by name."""
    with pytest.raises(NotImplementedError, match=r"torch.jit.script cannot compile autocuda's layers"):
        torch.jit.script(make())


TRACED = {
    "LIFNode": (lambda: ann.LIFNode(), (4, 3)),
    "izhikevich m": (lambda: ann.Neuron("izhikevich", step_mode="m"), (2, 4, 3)),
    "FlexSN": (lambda: ann.FlexSN(_core, 1, step_mode="s"), (4, 3)),
    "SlidingPSN": (lambda: ann.SlidingPSN(2), (4, 3)),
    "MaskedPSN m": (lambda: ann.MaskedPSN(2, 4, step_mode="m"), (4, 2, 3)),
    "BatchNormNeuron": (lambda: ann.BatchNormNeuron(3, dims=1), (4, 3)),
    "PSN": (lambda: ann.PSN(4), (4, 3)),
}


@pytest.mark.parametrize("make, shape", TRACED.values(), ids=TRACED.keys())
def test_fx_symbolic_trace_is_refused_by_name_and_leaves_trace(make, shape):
    """torch.fx.symbolic_trace failed with "x: expected a torch.Tensor, got Proxy", or (SlidingPSN's single steps)
    traced its first call's queue as constants, so the traced network's later steps were wrong, and left Proxies in
    the layer's queue. Refused by name; a Tracer that keeps the layers as leaves traces a network that calls them,
    their states carried over as in eager calls."""
    layer = make()
    net = nn.Sequential(nn.Identity(), layer)
    with pytest.raises(TypeError, match=r"torch.fx.symbolic_trace cannot trace into autocuda's layers"):
        torch.fx.symbolic_trace(net)
    sj_functional.reset_net(net)

    class Leaves(torch.fx.Tracer):
        def is_leaf_module(self, m, qualified_name):
            return m is layer or super().is_leaf_module(m, qualified_name)

    traced = torch.fx.GraphModule(net, Leaves().trace(net))
    xs = [_inputs(*shape, seed=i) for i in range(3)]
    eager = [net(x) for x in xs]
    sj_functional.reset_net(net)
    assert all(torch.equal(traced(x), e) for x, e in zip(xs, eager))


# -- repr, layers used twice, parameters changed ----------------------------------------------------------------
def test_repr_of_a_learned_parameter_does_not_warn():
    """extra_repr converted a learned parameter with float(), which warns about its gradient."""
    layer = ann.ParametricLIFNode()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = repr(layer)
    assert "w=Parameter(-0)" in text
    layer.v_threshold = 0.5
    assert "v_threshold=0.5" in repr(layer)


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_layer_used_twice_carries_its_states_as_spikingjellys(backend, step_mode):
    torch.manual_seed(0)
    linear, theirs_linear = nn.Linear(3, 3), nn.Linear(3, 3)
    theirs_linear.load_state_dict(linear.state_dict())
    ours, theirs = ann.LIFNode(backend=backend, step_mode=step_mode), sj_neuron.LIFNode(step_mode=step_mode)
    net, theirs_net = (nn.Sequential(lin, node, lin, node) for lin, node in ((linear, ours), (theirs_linear, theirs)))
    for seed in range(4):
        x = _inputs(*((5, 4, 3) if step_mode == "m" else (4, 3)), seed=seed, scale=3.0)
        assert torch.equal(net(x), theirs_net(x))
        assert torch.allclose(ours.v, theirs.v)


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_parameters_changed_after_the_fast_paths_are_used(backend, step_mode):
    """After calls of one shape (the keyed fast paths), an optimizer step, a no_grad edit of a tensor parameter and
    a parametrization each change what the next call computes."""
    x = _inputs(*((5, 4, 3) if step_mode == "m" else (4, 3)))
    layer = ann.ParametricLIFNode(backend=backend, step_mode=step_mode)
    optimizer = torch.optim.SGD(layer.parameters(), lr=10.0)
    for _ in range(3):
        layer.reset()
        layer(x).sum().backward()
    optimizer.step()
    twin = ann.ParametricLIFNode(backend="reference", step_mode=step_mode)
    with torch.no_grad():
        twin.w.copy_(layer.w)
    assert float(layer.w.detach()) != 0.0
    for _ in range(2):
        layer.reset()
        twin.reset()
        assert torch.equal(layer(x), twin(x))
    torch.nn.utils.parametrize.register_parametrization(layer, "w", _Three())
    with torch.no_grad():
        twin.w.fill_(3.0)
    layer.reset()
    twin.reset()
    assert torch.equal(layer(x), twin(x))
    lif = ann.LIFNode(backend=backend, step_mode=step_mode, v_threshold=torch.tensor(1.0))
    for _ in range(3):
        lif.reset()
        lif(x)
    with torch.no_grad():
        lif.v_threshold.fill_(0.1)
    lif.reset()
    assert torch.equal(lif(x), ann.LIFNode(backend="reference", step_mode=step_mode, v_threshold=0.1)(x))


class _Three(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 0 + 3.0


@pytest.mark.parametrize("make", [lambda: torch.nn.Parameter(torch.zeros(3)), "buffer"], ids=["Parameter", "buffer"])
def test_a_state_cannot_become_a_parameter_or_a_buffer(make):
    """A state is replaced by each call in the layer's dict: made a Parameter or a buffer, it was read by the first
    call only, then hidden by the states the calls stored (kept in named_parameters and state_dict, never read)."""
    layer = ann.LIFNode(backend="reference")
    with pytest.raises(TypeError, match="'v' is a state, which each call replaces"):
        if make == "buffer":
            layer.register_buffer("v", torch.zeros(3))
        else:
            layer.v = make()
    layer.v = torch.full((3,), 0.25)  # a tensor is a state's value, as before
    layer(torch.ones(3))
    assert torch.equal(layer.v, torch.full((3,), 0.625))
