"""NIR against the other frameworks' own exporters and importers: snnTorch 1.0 and Norse 1.1 (SpikingJelly 2.0's
are in test_nir.py). Each direction runs the peer and us on the same inputs; where a peer deviates from NIR's
documented equations, a direct float64 simulation of the graph (tests/nir_reference.py) is the judge, and the
deviation is pinned here and described in docs/nir.md.

The peers run in float32 (snnTorch's and Norse's NIR paths build float32 modules); we and the reference run the
graphs in float64. Spikes are compared exactly: a float32 and a float64 membrane fall on different sides of a
threshold only within about 1e-7 of it, which these random inputs do not meet.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

nir = pytest.importorskip("nir")

from backends import CPU_BACKENDS  # noqa: E402
from nir_reference import simulate  # noqa: E402

from autocuda.nn import IFNode, LIFNode  # noqa: E402
from autocuda.tools.nir import from_nir, to_nir  # noqa: E402

F64 = torch.float64
T = 20


def _snntorch():
    snn = pytest.importorskip("snntorch", reason="snnTorch 1.0 (a test extra) runs the snnTorch directions")
    pytest.importorskip("snntorch.export_nir", reason="snnTorch's NIR exchange needs nirtorch")
    from snntorch import utils
    from snntorch.export_nir import export_to_nir
    from snntorch.import_nir import import_from_nir
    return snn, utils, export_to_nir, import_from_nir


def _norse():
    norse = pytest.importorskip("norse.torch", reason="Norse 1.1 (a test extra) runs the Norse directions")
    from norse.torch.utils.export_nir import to_nir as export
    from norse.torch.utils.import_nir import from_nir as load
    return norse, export, load


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.uniform_(layer.weight, -0.2, 1.0)  # mostly excitatory: every layer spikes
    return layer


def _ours(graph: nir.NIRGraph, x: torch.Tensor, **options) -> np.ndarray:
    with torch.no_grad():
        return from_nir(graph, dtype=F64, **options)(x.double()).numpy()


def _steps(step, x: torch.Tensor) -> np.ndarray:
    """A peer's module run one step at a time: step(x_t) -> spikes."""
    with torch.no_grad():
        return torch.stack([step(x_t) for x_t in x]).double().numpy()


# -- snnTorch 1.0 ------------------------------------------------------------------------------------------------------
def _leaky(snn, n: int, **options):
    return snn.Leaky(beta=torch.rand(n) * 0.4 + 0.5, threshold=torch.rand(n) * 0.5 + 0.5, learn_threshold=False,
                     init_hidden=True, **options)


def _first(out):
    """The spikes of a peer's step: snnTorch's output layers and nirtorch's modules return (spikes, state), and
    snnTorch's import of an IF ((spikes, membrane), state)."""
    while isinstance(out, tuple):
        out = out[0]
    return out


def _snntorch_run(utils, net: nn.Module, x: torch.Tensor) -> np.ndarray:
    utils.reset(net)
    return _steps(lambda x_t: _first(net(x_t)), x)


def test_snntorch_export_of_leaky_and_synaptic_imports_as_nir_says() -> None:
    """Leaky and Synaptic with a reset to zero at the step that spikes (reset_mechanism='zero',
    reset_delay=False): what their exporter's LIF and CubaLIF (w_in = tau_syn / dt) mean. Synaptic steps its
    current first: method='semi_implicit'."""
    snn, utils, export, _ = _snntorch()
    torch.manual_seed(0)
    zero = {"reset_mechanism": "zero", "reset_delay": False}
    net = nn.Sequential(_linear(3, 5), _leaky(snn, 5, **zero), _linear(5, 4), _leaky(snn, 4, output=True, **zero))
    graph = export(net, torch.rand(1, 3), ignore_dims=[0])
    x = torch.rand(T, 2, 3) * 2
    theirs, reference = _snntorch_run(utils, net, x), simulate(graph, x.numpy(), 1e-4)
    assert theirs.sum() > 10 and np.array_equal(theirs, reference)
    assert np.array_equal(_ours(graph, x), reference)

    synaptic = snn.Synaptic(alpha=torch.rand(4) * 0.3 + 0.5, beta=torch.rand(4) * 0.3 + 0.6, threshold=torch.full(
        (4,), 0.8), learn_threshold=False, init_hidden=True, output=True, **zero)
    net = nn.Sequential(_linear(3, 4), synaptic)
    graph = export(net, torch.rand(1, 3), ignore_dims=[0])
    assert isinstance(graph.nodes["1"], nir.CubaLIF)
    theirs, reference = _snntorch_run(utils, net, x), simulate(graph, x.numpy(), 1e-4, current_first=True)
    assert theirs.sum() > 10 and np.array_equal(theirs, reference)
    assert np.array_equal(_ours(graph, x, method="semi_implicit"), reference)


def test_snntorch_export_of_a_recurrent_leaky_imports_as_nir_says() -> None:
    """RLeaky exports as lif <-> w_rec (nodes '1.lif', '1.w_rec'); with a bias-free recurrent layer, all agree."""
    snn, utils, export, _ = _snntorch()
    torch.manual_seed(1)
    rleaky = snn.RLeaky(beta=torch.full((4,), 0.8), threshold=torch.full((4,), 0.7), linear_features=4,
                        reset_mechanism="zero", reset_delay=False, init_hidden=True, output=True,
                        learn_threshold=False)
    nn.init.zeros_(rleaky.recurrent.bias)
    net = nn.Sequential(_linear(3, 4), rleaky)
    graph = export(net, torch.rand(1, 3), ignore_dims=[0])
    x = torch.rand(T, 2, 3) * 2
    theirs, reference = _snntorch_run(utils, net, x), simulate(graph, x.numpy(), 1e-4)
    assert theirs.sum() > 10 and np.array_equal(theirs, reference)
    model = from_nir(graph, dtype=F64)
    assert model.recurrent
    assert np.array_equal(_ours(graph, x), reference)


def test_snntorch_deviations_from_nir() -> None:
    """Pinned deviations (docs/nir.md): the default Leaky (subtract the threshold, reset one step late) is
    exported as a reset to zero; RLeaky's recurrent bias reaches the membrane from the first step, where NIR's
    recurrent edge carries nothing yet; the importer turns an IF into a Leaky of beta 0.9."""
    snn, utils, export, load = _snntorch()
    torch.manual_seed(2)
    x = torch.rand(T, 2, 3) * 2
    net = nn.Sequential(_linear(3, 4), _leaky(snn, 4, output=True))  # the defaults: subtract, delayed
    graph = export(net, torch.rand(1, 3), ignore_dims=[0])
    reference = simulate(graph, x.numpy(), 1e-4)
    assert not np.array_equal(_snntorch_run(utils, net, x), reference)
    assert np.array_equal(_ours(graph, x), reference)

    rleaky = snn.RLeaky(beta=torch.full((4,), 0.8), threshold=torch.full((4,), 0.7), linear_features=4,
                        reset_mechanism="zero", reset_delay=False, init_hidden=True, output=True,
                        learn_threshold=False)
    nn.init.constant_(rleaky.recurrent.bias, 0.5)
    net = nn.Sequential(_linear(3, 4), rleaky)
    graph = export(net, torch.rand(1, 3), ignore_dims=[0])
    reference = simulate(graph, x.numpy(), 1e-4)
    theirs = _snntorch_run(utils, net, x)
    assert not np.array_equal(theirs, reference) and np.array_equal(_ours(graph, x), reference)

    dt = 1e-4
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([3])), "if": nir.IF(r=np.full(3, 1.0), v_threshold=np.full(
        3, 2e-4), v_reset=np.zeros(3)), "output": nir.Output(np.array([3]))},
        edges=[("input", "if"), ("if", "output")], type_check=False)
    reference = simulate(graph, x.numpy(), dt)
    model = load(graph)
    theirs = _steps(lambda x_t: _first(model(x_t)), x)
    assert not np.array_equal(theirs, reference) and np.array_equal(_ours(graph, x, dt=dt), reference)


def test_snntorch_imports_our_export() -> None:
    """Our LIF layers (reset to 0, one threshold per layer: what snnTorch's importer takes) -> NIR -> snnTorch."""
    _, utils, _, load = _snntorch()
    torch.manual_seed(3)
    ours = nn.Sequential(_linear(3, 5), LIFNode(tau=4.0, v_threshold=0.5, v_reset=0.0), _linear(5, 4),
                         LIFNode(tau=2.0, v_threshold=0.3, v_reset=0.0)).double()
    x = torch.rand(T, 2, 3, dtype=F64) * 2
    graph = to_nir(ours, x[0], dt=1e-4)
    reference = simulate(graph, x.numpy(), 1e-4)
    expected = _steps(ours, x)
    theirs = load(graph)
    utils.reset(theirs)
    got = _steps(lambda x_t: _first(theirs(x_t.float())), x)
    assert expected.sum() > 10 and np.array_equal(expected, reference) and np.array_equal(got, reference)


# -- Norse 1.1 ---------------------------------------------------------------------------------------------------------
def _norse_run(net, x: torch.Tensor) -> np.ndarray:
    state, out = None, []
    with torch.no_grad():
        for x_t in x:
            z, state = net(x_t, state)
            out.append(z)
    return torch.stack(out).double().numpy()


def test_norse_export_writes_time_constants_dt_times_too_small() -> None:
    """Norse 1.1 writes tau = dt / tau_inv (and CubaLIF without w_in), where NIR means tau = 1 / tau_inv seconds:
    their graphs, run as NIR says, are another network. We import what the graph says (the reference), and the
    graph with tau / dt (and w_in = tau_syn / dt) gives Norse's spikes exactly."""
    norse, export, _ = _norse()
    dt = 1e-3
    torch.manual_seed(4)
    box = norse.LIFBoxCell(norse.LIFBoxParameters(tau_mem_inv=torch.full((4,), 200.0), v_th=torch.full((4,), 0.3),
                                                  v_leak=torch.zeros(4)), dt=dt)
    net = norse.SequentialState(_linear(3, 4), box)
    graph = export(net, torch.rand(1, 3), dt=dt)
    x = torch.rand(T, 2, 3) * 2
    theirs, reference = _norse_run(net, x), simulate(graph, x.numpy(), dt)
    assert theirs.sum() > 10 and not np.array_equal(theirs, reference)
    assert np.array_equal(_ours(graph, x, dt=dt), reference)
    graph.nodes["1"].tau = np.asarray(graph.nodes["1"].tau) / dt
    assert np.array_equal(_ours(graph, x, dt=dt), theirs)

    cell = norse.LIFCell(norse.LIFParameters(tau_mem_inv=torch.full((4,), 200.0), tau_syn_inv=torch.full((4,), 300.0),
                                             v_th=torch.full((4,), 0.3), v_leak=torch.zeros(4)), dt=dt)
    net = norse.SequentialState(_linear(3, 4), cell)
    graph = export(net, torch.rand(1, 3), dt=dt)
    theirs = _norse_run(net, x)
    cuba = graph.nodes["1"]
    assert np.allclose(cuba.w_in, 1.0)
    cuba.tau_syn, cuba.tau_mem = np.asarray(cuba.tau_syn) / dt, np.asarray(cuba.tau_mem) / dt
    cuba.w_in = cuba.tau_syn / dt  # Norse adds the input to the current whole: w_in dt / tau_syn = 1
    # Norse's LIF adds the input to the current before the membrane step: method='semi_implicit'
    assert theirs.sum() > 10 and np.array_equal(_ours(graph, x, dt=dt, method="semi_implicit"), theirs)
    assert np.array_equal(simulate(graph, x.numpy(), dt, current_first=True), theirs)


def test_norse_imports_our_export() -> None:
    """Our LIF (r = 1, reset to 0: what Norse's LIFBox takes) and IF -> NIR -> Norse, all as NIR says."""
    _, _, load = _norse()
    dt = 1e-3
    torch.manual_seed(5)
    ours = nn.Sequential(_linear(3, 5), LIFNode(tau=4.0, v_threshold=0.5, v_reset=0.0), _linear(5, 4),
                         IFNode(v_threshold=0.8, v_reset=0.0)).double()
    x = torch.rand(T, 2, 3, dtype=F64) * 2
    graph = to_nir(ours, x[0], dt=dt)
    reference = simulate(graph, x.numpy(), dt)
    expected = _steps(ours, x)
    got = _norse_run(load(graph, dt=dt, ignore_warnings=True), x.float())
    assert expected.sum() > 10 and np.array_equal(expected, reference) and np.array_equal(got, reference)


# -- the threshold: NIR (and snnTorch, Norse) spike where v > v_threshold ---------------------------------------------
EXACT_DT = 2.0**-10  # dt, dt / tau and dt r exact in binary: membranes land exactly on the thresholds below


def _ties() -> tuple[nir.NIRGraph, np.ndarray]:
    """input -> Affine (integer weights) -> LIF, IF and CubaLIF side by side, each with a threshold its membrane
    reaches exactly at some step, and inputs of ones."""
    n = 2
    affine = nir.Affine(weight=np.array([[1.0], [2.0]]), bias=np.zeros(n))
    lif = nir.LIF(tau=np.full(n, 2 * EXACT_DT), r=np.full(n, 2.0), v_leak=np.zeros(n),
                  v_threshold=np.array([1.5, 3.0]), v_reset=np.zeros(n))  # v: 1, 1.5, ... and 2, 3, ...
    if_node = nir.IF(r=np.full(n, 1 / EXACT_DT), v_threshold=np.array([2.0, 4.0]), v_reset=np.zeros(n))
    cuba = nir.CubaLIF(tau_syn=np.full(n, 2 * EXACT_DT), tau_mem=np.full(n, 2 * EXACT_DT), r=np.full(n, 2.0),
                       v_leak=np.zeros(n), v_threshold=np.array([1.5, 3.0]), v_reset=np.zeros(n), w_in=np.full(n, 2.0))
    nodes = {"input": nir.Input(np.array([1])), "fc": affine, "lif": lif, "if": if_node, "cuba": cuba,
             "output": nir.Output(np.array([n]))}
    edges = [("input", "fc"), ("fc", "lif"), ("fc", "if"), ("fc", "cuba"), ("lif", "output"), ("if", "output"),
             ("cuba", "output")]
    return nir.NIRGraph(nodes=nodes, edges=edges, type_check=False), np.ones((8, 1, 1))


def _membrane_hits_threshold(graph: nir.NIRGraph, x: np.ndarray) -> bool:
    """Whether some neuron's membrane (before any spike) equals its threshold exactly: the test is about ties."""
    lif, if_node = graph.nodes["lif"], graph.nodes["if"]
    v_lif, v_if, hits = np.zeros(2), np.zeros(2), False
    drive = np.array([1.0, 2.0])
    for _ in x:
        v_lif = v_lif + EXACT_DT / lif.tau * (lif.r * drive - v_lif)
        v_if = v_if + EXACT_DT * if_node.r * drive
        hits |= bool(np.any(v_lif == lif.v_threshold) or np.any(v_if == if_node.v_threshold))
    return hits


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("method", ["euler", "semi_implicit"])
def test_an_import_spikes_where_v_exceeds_the_threshold_as_nir_says(method: str, backend: str) -> None:
    """from_nir's neurons spike at v > v_threshold (fires_at ">"): where membranes land exactly on their
    thresholds, as NIR's equations say, on the reference and on the generated kernels."""
    graph, x = _ties()
    assert _membrane_hits_threshold(graph, x)
    reference = simulate(graph, x, EXACT_DT, current_first=method == "semi_implicit")
    assert reference.sum() > 3
    got = _ours(graph, torch.as_tensor(x), dt=EXACT_DT, method=method, backend=backend)
    assert np.array_equal(got, reference)


def test_the_shipped_lif_exports_as_nir_and_differs_only_at_ties() -> None:
    """Our LIFNode spikes at >= (as SpikingJelly's); its export is NIR's LIF (>): the re-import differs exactly
    where a membrane lands on the threshold, and a LIFNode with fires_at '>' re-imports identically."""
    import dataclasses

    from autocuda.nn import Neuron
    from autocuda.spec import load_spec

    strict = dataclasses.replace(load_spec("lif"), fires_at=">")
    x = torch.ones(6, 1, 1, dtype=F64)
    for spec, same in ((load_spec("lif"), False), (strict, True)):
        model = nn.Sequential(nn.Linear(1, 1, bias=False), Neuron(spec, tau=2.0, v_threshold=0.75, v_reset=0.0))
        model = model.double()
        nn.init.ones_(model[0].weight)  # v: 0.5, 0.75 (the threshold), ...
        expected = _steps(model, x)
        graph = to_nir(model, x[0], dt=1e-4)
        assert np.array_equal(_ours(graph, x), simulate(graph, x.numpy(), 1e-4))
        assert np.array_equal(_ours(graph, x), expected) is same
