"""autocuda.nn on the CPU: SpikingJelly-compatible constructors and defaults, state kept between calls and
reset, step modes agree, soft reset, learnable parameters, dtypes, repr, errors, and torch.compile
(fullgraph, through the host runner)."""
from __future__ import annotations

import inspect
import math
import pickle

import pytest
import torch
from conftest import compile_launched
from torch import nn

from autocuda import nn as ann
from autocuda.call import functional as F
from autocuda.nn.spikingjelly_more import HalfThresholdIFNode, SimpleLIFNode
from autocuda.spec.load import load_spec
from autocuda.spec.surrogate import ATan, Sigmoid

CLASSES = [ann.IFNode, ann.LIFNode, ann.ParametricLIFNode, ann.QIFNode, ann.EIFNode, ann.IzhikevichNode,
           ann.AdExNode, ann.ALIFNode]

# SpikingJelly's documented constructor defaults (model parameters), which ours must equal.
SPIKINGJELLY_DEFAULTS = {
    ann.IFNode: {"v_threshold": 1.0, "v_reset": 0.0},
    ann.LIFNode: {"tau": 2.0, "decay_input": True, "v_threshold": 1.0, "v_reset": 0.0},
    ann.ParametricLIFNode: {"init_tau": 2.0, "decay_input": True, "v_threshold": 1.0, "v_reset": 0.0},
    ann.QIFNode: {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_threshold": 1.0, "v_rest": 0.0, "v_reset": -0.1},
    ann.EIFNode: {"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_threshold": 1.0, "v_rest": 0.0, "v_reset": -0.1},
    ann.IzhikevichNode: {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_threshold": 1.0, "v_reset": 0.0, "v_rest": -0.1,
                         "w_rest": 0.0, "tau_w": 2.0, "a": 0.0, "b": 0.0},
}
COMMON = ("surrogate_function", "detach_reset", "step_mode", "backend", "store_v_seq")


def x_seq(*shape: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 1.8 - 0.3).to(dtype)


@pytest.mark.parametrize("cls", list(SPIKINGJELLY_DEFAULTS))
def test_constructor_defaults_match_spikingjelly(cls):
    signature = inspect.signature(cls)
    names = [n for n in signature.parameters if n not in COMMON]
    assert names == list(SPIKINGJELLY_DEFAULTS[cls])  # same names in the same (positional) order
    assert {n: signature.parameters[n].default for n in names} == SPIKINGJELLY_DEFAULTS[cls]
    assert signature.parameters["surrogate_function"].default == Sigmoid(alpha=4.0)


@pytest.mark.parametrize("cls", CLASSES)
def test_model_defaults_equal_the_spec_defaults(cls):
    node = cls()
    for p in node.spec.params:
        value = getattr(node, p.name)
        value = value.detach() if isinstance(value, torch.Tensor) else value
        assert float(value) == pytest.approx(p.default), p.name


@pytest.mark.parametrize("cls", CLASSES)
def test_step_modes_agree_and_state_persists(cls):
    x = x_seq(6, 2, 5)
    node = cls(step_mode="m", store_v_seq=True)
    spikes = torch.cat([node(x[:3]), node(x[3:])])  # the second call continues from the first's states
    finals = [getattr(node, s) for s in node.state_names]
    assert node.v_seq.shape == (3, 2, 5) and torch.equal(node.v_seq[-1], node.v)
    node.reset()
    assert all(isinstance(getattr(node, s), float) for s in node.state_names) and node.v_seq is None
    node.step_mode = "s"
    stepped = torch.stack([node(xt) for xt in x])
    assert torch.equal(stepped, spikes)
    for s, final in zip(node.state_names, finals):
        torch.testing.assert_close(getattr(node, s), final)


def test_reset_net_style_reset_restores_initial_values():
    net = nn.Sequential(nn.Linear(4, 4), ann.IzhikevichNode(w_rest=0.3, v_reset=-0.2), ann.LIFNode(v_reset=None))
    net(torch.ones(2, 4))
    for module in net.modules():  # what spikingjelly.activation_based.functional.reset_net does
        if hasattr(module, "reset"):
            module.reset()
    assert net[1].v == -0.2 and net[1].w == 0.3 and net[2].v == 0.0


def test_soft_reset_when_v_reset_is_none():
    x = x_seq(8, 6, seed=1) * 2
    node = ann.LIFNode(v_reset=None, step_mode="m")
    spikes = node(x)
    v, want = torch.zeros(6), []
    for xt in x:
        h = v + (xt - v) / 2
        s = (h >= 1.0).float()
        v = h - s
        want.append(s)
    assert torch.equal(spikes, torch.stack(want)) and spikes.sum() > 0
    torch.testing.assert_close(node.v, v)


def test_decay_input_false():
    x = x_seq(3, 4, seed=2)
    node = ann.LIFNode(tau=4.0, decay_input=False, step_mode="m")
    node(x)
    v = torch.zeros(4)
    for xt in x:
        h = v - v / 4 + xt
        v = h * (h < 1.0)
    torch.testing.assert_close(node.v, v)


def test_parametric_lif_learns_w():
    node = ann.ParametricLIFNode(init_tau=3.0, step_mode="m")
    assert isinstance(node.w, nn.Parameter) and node.w.item() == pytest.approx(-math.log(2.0))
    assert [n for n, _ in node.named_parameters()] == ["w"]
    node(x_seq(5, 8, seed=3)).sum().backward()
    assert node.w.grad is not None and node.w.grad.shape == () and node.w.grad != 0


def test_generic_neuron_with_per_channel_parameter():
    w = nn.Parameter(torch.zeros(3, 1))
    node = ann.Neuron("parametric_lif", w=w, step_mode="m", surrogate_function=ATan())
    out = node(x_seq(4, 2, 3, 5))
    (out.sum() + node.v.sum()).backward()
    assert w.grad.shape == (3, 1)
    assert "spec='parametric_lif'" in repr(node) and "w=Parameter[3, 1]" in repr(node) and "ATan" in repr(node)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_dtypes(dtype):
    node = ann.ParametricLIFNode(step_mode="m")
    x = x_seq(4, 3, dtype=dtype).requires_grad_()
    out = node(x)
    out.sum().backward()
    assert out.dtype == dtype and node.v.dtype == dtype and x.grad.dtype == dtype
    assert node.w.dtype == torch.float32 and node.w.grad.dtype == torch.float32


def test_extra_repr_shows_spec_and_parameters():
    text = repr(ann.EIFNode(delta_T=0.5, v_reset=None))
    for part in ("spec='eif'", "delta_T=0.5", "theta_rh=0.8", "v_reset=None", "step_mode='s'", "Sigmoid"):
        assert part in text


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: ann.LIFNode(step_mode="x"), ValueError, "step_mode"),
    (lambda: ann.Neuron("lif", taux=1.0), TypeError, "unknown parameter 'taux'"),
    (lambda: ann.Neuron("lif", initial={"q": 1.0}), TypeError, "initial: 'q' is not a state"),
    # these failed inside: an AttributeError of the reset, Python's "argument after ** must be a mapping", a call
    (lambda: ann.Neuron("lif", initial={"v": "nope"}), ValueError,
     "^initial: state 'v' starts at 'nope', which is neither a parameter nor an attribute"),
    (lambda: ann.Neuron("lif", initial={"v": [1.0]}), TypeError, "^initial: state 'v': an initial value must be"),
    (lambda: ann.Neuron("lif", initial=[0.0]), TypeError, r"^initial: expected a mapping by name \(a dict\)"),
    (lambda: ann.Neuron("lif", options=["decay_input"]), TypeError, "^options: expected a mapping by name"),
    (lambda: ann.LIFNode(backend="tpu"), ValueError, "backend"),
    (lambda: ann.ParametricLIFNode(init_tau=1.0), ValueError, "init_tau"),
])
def test_constructor_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_multi_step_mode_needs_a_time_dimension():
    with pytest.raises(ValueError, match=r"\[T, \*\]"):
        ann.LIFNode(step_mode="m")(torch.zeros(()))
    # [T] is one neuron, as SpikingJelly takes it (tests/test_sj_protocol.py compares the values)
    assert ann.LIFNode(step_mode="m")(torch.zeros(3)).shape == (3,)


class TwoLayer(nn.Module):
    def __init__(self, backend: str):
        super().__init__()
        self.fc1, self.lif = nn.Linear(6, 10), ann.LIFNode(step_mode="m", backend=backend)
        self.fc2, self.izh = nn.Linear(10, 3), ann.IzhikevichNode(step_mode="m", a=0.1, b=0.2, backend=backend)
        for fc in (self.fc1, self.fc2):  # enough drive for both layers to fire
            nn.init.uniform_(fc.weight, -0.2, 0.8)

    def forward(self, x):
        return self.izh(self.fc2(self.lif(self.fc1(x))))


def _eager_two_layer() -> None:
    net = TwoLayer("host")
    net(x_seq(6, 2, 6)).sum().backward()


def _eager_single_step_and_sequence() -> None:
    x = x_seq(3, 2, 5, seed=6) * 2
    [ann.IzhikevichNode(step_mode="s", a=0.1, b=0.2, backend="host")(xt) for xt in x]
    ann.LIFNode(step_mode="m", store_v_seq=True, backend="host")(x)


@pytest.fixture(scope="module")
def host_kernels() -> int:
    """The host kernels of the torch.compile tests below, compiled up front many to a compiler run
    (`conftest.compile_launched`): the tests would compile them one kernel a run."""
    with torch.random.fork_rng():  # the layers' initialisation draws from the global generator
        return compile_launched(_eager_two_layer, _eager_single_step_and_sequence)


def test_torch_compile_fullgraph_matches_eager(host_kernels):
    torch.manual_seed(0)
    net = TwoLayer("host")
    x = torch.rand(6, 2, 6) * 1.5

    def run(model):
        net.lif.reset(), net.izh.reset(), net.zero_grad()
        first, second = model(x), model(x)  # the second call starts from the first's states
        (first.sum() + 2 * second.sum() + net.izh.w.sum()).backward()
        return [first, second, *(p.grad.clone() for p in net.parameters())]

    eager = run(net)
    torch._dynamo.reset()
    compiled = run(torch.compile(net, fullgraph=True, backend="aot_eager"))
    assert eager[0].sum() > 0 and eager[1].sum() > 0
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


def test_pickled_layer_works_where_its_spec_was_never_registered():
    from autocuda.runtime import configs

    node = ann.Neuron(load_spec("lif").with_defaults(tau=3.0), step_mode="m", surrogate_function=ATan(alpha=3.0))
    data = pickle.dumps(node)
    del configs._OBJECTS[node._spec_ref], configs._OBJECTS[node._surrogate_ref]  # as in a fresh process
    x = x_seq(4, 5)
    assert torch.equal(pickle.loads(data)(x), node(x))


def test_initial_values_and_switches_set_after_building_take_effect_or_are_refused():
    """IzhikevichNode's and AdExNode's w_rest (w's initial value) set on a built layer takes effect at its next
    reset (SpikingJelly's keeps the first), HalfThresholdIFNode's v_threshold there too (v starts at half of it);
    MPBNLIFNode's learnable_vth set False fires at v_threshold, and set True is refused by name where the layer has
    no learned threshold `a` (it would fail inside the call)."""
    x = x_seq(4, 2, 5, seed=5) * 2
    for cls, name in ((ann.IzhikevichNode, "w_rest"), (ann.AdExNode, "w_rest"), (HalfThresholdIFNode, "v_threshold")):
        state = "v" if name == "v_threshold" else "w"
        node, want = cls(step_mode="m"), cls(**{name: 1.6}, step_mode="m")
        node(x)
        setattr(node, name, 1.6)
        node.reset()
        assert getattr(node, state) == getattr(want, state) != getattr(cls(), state), cls.__name__
        assert torch.equal(node(x), want(x)) and torch.equal(getattr(node, state), getattr(want, state)), cls.__name__
    images = torch.rand(4, 2, 3, 4, 4) * 2
    learned = ann.MPBNLIFNode(out_channels=3, step_mode="m", learnable_vth=True)
    plain = ann.MPBNLIFNode(out_channels=3, step_mode="m")
    plain.load_state_dict({k: v for k, v in learned.state_dict().items() if k != "a"})
    with torch.no_grad():
        learned.a.fill_(0.5)  # a threshold of exp(0.5), where v_threshold is 1
    assert not torch.equal(learned(images), plain(images))
    learned.reset(), plain.reset()
    learned.learnable_vth = False
    assert torch.equal(learned(images), plain(images))
    with pytest.raises(AttributeError, match="learnable_vth.*construction"):
        plain.learnable_vth = True
    simple = SimpleLIFNode(2.0, True, step_mode="m")
    with pytest.raises(ValueError, match="v_reset: SimpleLIFNode needs a number"):
        simple.v_reset = None  # as SimpleLIFNode(..., v_reset=None): SpikingJelly's has no soft reset
    simple.v_reset = -0.1
    assert torch.equal(simple(x), SimpleLIFNode(2.0, True, v_reset=-0.1, step_mode="m")(x))


def test_spec_names_and_tables_agree():
    for cls in CLASSES:
        node = cls()
        assert node.spec == load_spec(node.spec.name).with_options(**dict(node.spec.options))
        assert node.state_names == tuple(s.name for s in node.spec.states)


def test_parameter_changes_between_calls_take_effect():
    """A layer reads its parameters on every call, wherever nn.Module keeps them: plain attributes, parameters
    (replaced or updated in place), buffers (registered later, replaced) and parametrizations."""
    x = x_seq(4, 2, 5, seed=4) * 2

    def check(node, **params):  # as a fresh layer of these parameters, from its initial states
        node.reset()
        want = type(node)(step_mode="m", **params)
        assert torch.equal(node(x), want(x)) and torch.equal(node.v, want.v)

    node = ann.LIFNode(step_mode="m")
    node(x)
    node.tau = 3.0
    check(node, tau=3.0)
    node.v_threshold = nn.Parameter(torch.tensor(0.5))  # nn.Module moves the name to its parameters
    check(node, tau=3.0, v_threshold=0.5)
    with torch.no_grad():
        node.v_threshold.fill_(0.7)
    check(node, tau=3.0, v_threshold=0.7)
    del node.v_reset
    node.register_buffer("v_reset", torch.full((5,), -0.1))
    check(node, tau=3.0, v_threshold=0.7, v_reset=torch.full((5,), -0.1))
    node.v_reset = torch.linspace(-0.3, 0.0, 5)  # replaces the buffer
    check(node, tau=3.0, v_threshold=0.7, v_reset=torch.linspace(-0.3, 0.0, 5))

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    plif = ann.ParametricLIFNode(init_tau=3.0, step_mode="m")
    torch.nn.utils.parametrize.register_parametrization(plif, "w", Double())  # w: a property of a new class
    want = ann.Neuron("parametric_lif", w=2 * -math.log(2.0), step_mode="m")
    torch.testing.assert_close(plif(x), want(x))
    torch.testing.assert_close(plif.v, want.v)


def test_states_after_reset_and_states_set_by_hand():
    x = x_seq(3, 2, 5, seed=5)
    v_reset = torch.linspace(-0.2, 0.0, 5, dtype=torch.float64)
    node = ann.IzhikevichNode(v_reset=None, w_rest=0.25, step_mode="m", store_v_seq=True)
    node(x)
    assert isinstance(node.v, torch.Tensor) and node.v_seq.shape == (3, 2, 5)
    node.reset()
    assert (node.v, node.w, node.v_seq) == (0.0, 0.25, None)  # a soft reset starts at 0
    generic = ann.Neuron("izhikevich", v_reset=nn.Parameter(v_reset), initial={"w": 0.1}, step_mode="m")
    generic(x.double())
    generic.reset()
    assert torch.equal(generic.v, v_reset) and not generic.v.requires_grad and generic.w == 0.1
    fresh = ann.Neuron("izhikevich", v_reset=v_reset, initial={"w": 0.1}, step_mode="m")
    out = generic(x)  # v: expanded to the neuron shape and cast to x's dtype
    assert torch.equal(out, fresh(x)) and generic.v.dtype == torch.float32 and generic.v.shape == (2, 5)
    v, w = torch.full((2, 5), 0.5, dtype=torch.float64), torch.full((2, 5), 0.2)
    node.v, node.w = v, w  # states set by hand are where the next call starts
    spikes, (v1, w1), _ = F.multi_step("izhikevich", x, v.float(), w, surrogate=Sigmoid(), v_reset=None)
    assert torch.equal(node(x), spikes) and torch.equal(node.v, v1) and torch.equal(node.w, w1)


def test_torch_compile_single_step_and_stored_sequences_match_eager(host_kernels):
    x = x_seq(3, 2, 5, seed=6) * 2
    eager = ann.IzhikevichNode(step_mode="s", a=0.1, b=0.2, backend="host")
    seq = ann.LIFNode(step_mode="m", store_v_seq=True, backend="host")

    def run(single, multi):
        eager.reset(), seq.reset()
        out = [single(xt) for xt in x] + [multi(x), multi(x)]
        return out + [eager.v, eager.w, seq.v, seq.v_seq]

    want = run(eager, seq)
    torch._dynamo.reset()
    got = run(torch.compile(eager, fullgraph=True, backend="aot_eager"),
              torch.compile(seq, fullgraph=True, backend="aot_eager"))
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b)
