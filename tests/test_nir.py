"""NIR import and export (autocuda.nir): graphs from SpikingJelly's exporter and graphs built the way snnTorch's
and Norse's exporters build them give the outputs of the source framework, or of a direct simulation of NIR's
equations written here; to_nir -> nir.write -> nir.read -> from_nir gives the same outputs; every refusal.

Everything runs on CPU in float64, with backend "reference" and "host" (the generated CUDA compiled for the CPU).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

nir = pytest.importorskip("nir")  # SpikingJelly's NIR exchange also needs nirtorch: those tests skip without it

from backends import CPU_BACKENDS, NEEDS_HOST  # noqa: E402
from conftest import compile_launched  # noqa: E402

from autocuda.base.errors import NIRError  # noqa: E402
from autocuda.nn import IFNode, LIFNode, Neuron, ParametricLIFNode  # noqa: E402
from autocuda.nn.spikingjelly_more import SimpleIFNode  # noqa: E402
from autocuda.spec import NeuronSpec  # noqa: E402
from autocuda.spec.load import load_spec  # noqa: E402
from autocuda.toolchain.host import cxx as toolchain  # noqa: E402
from autocuda.tools.monitor import Monitor  # noqa: E402
from autocuda.tools.nir import NIRModule, from_nir, to_nir  # noqa: E402

DT = 1e-4
F64 = torch.float64
BACKENDS = CPU_BACKENDS


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- direct simulations of NIR's equations (spike where v > v_threshold, hard reset) -----------------------------
def _lif(x: np.ndarray, node: nir.LIF, method: str = "euler") -> np.ndarray:
    v = np.broadcast_to(node.v_leak, x.shape[1:]).copy()
    out = []
    for x_t in x:
        target = node.v_leak + node.r * x_t
        v = v + DT / node.tau * (target - v) if method == "euler" else target + (v - target) * np.exp(-DT / node.tau)
        z = v > node.v_threshold
        v = np.where(z, node.v_reset, v)
        out.append(z.astype(float))
    return np.stack(out)


def _if(x: np.ndarray, node: nir.IF) -> np.ndarray:
    v, out = np.broadcast_to(node.v_reset, x.shape[1:]).copy(), []
    for x_t in x:
        v = v + DT * node.r * x_t
        z = v > node.v_threshold
        v = np.where(z, node.v_reset, v)
        out.append(z.astype(float))
    return np.stack(out)


def _cuba(x: np.ndarray, node: nir.CubaLIF | nir.CubaLI, spiking: bool = True, current_first: bool = False
          ) -> np.ndarray:
    """Euler: both states from their start-of-step values, or (current_first) v stepped with the new i."""
    v, i, out = np.broadcast_to(node.v_leak, x.shape[1:]).copy(), np.zeros(x.shape[1:]), []
    for x_t in x:
        new_i = i + DT / node.tau_syn * (node.w_in * x_t - i)
        v, i = v + DT / node.tau_mem * (node.v_leak - v + node.r * (new_i if current_first else i)), new_i
        if spiking:
            z = v > node.v_threshold
            v = np.where(z, node.v_reset, v)
        out.append(z.astype(float) if spiking else v)
    return np.stack(out)


def _affine(x: np.ndarray, node: nir.Affine | nir.Linear) -> np.ndarray:
    return x @ node.weight.T + getattr(node, "bias", 0.0)


def _graph(*nodes: nir.NIRNode, edges: list[tuple[str, str]] | None = None) -> nir.NIRGraph:
    """A chain input -> n0 -> n1 -> ... -> output, plus any extra edges."""
    names = ["input", *(f"n{k}" for k in range(len(nodes))), "output"]
    first = nodes[0].input_type["input"]
    table = {"input": nir.Input(input_type=np.array(first)), **{f"n{k}": n for k, n in enumerate(nodes)},
             "output": nir.Output(output_type=np.array(nodes[-1].output_type["output"]))}
    return nir.NIRGraph(nodes=table, edges=list(zip(names[:-1], names[1:])) + (edges or []), type_check=False)


def _run(graph: nir.NIRGraph | NIRModule, x: np.ndarray, **options) -> np.ndarray:
    model = graph if isinstance(graph, NIRModule) else from_nir(graph, dtype=F64, **options)
    with torch.no_grad():
        return model(torch.as_tensor(x)).numpy()


# -- graphs built the way snnTorch's and Norse's exporters build them -----------------------------------------------
def _snntorch_lif(n: int, rng: np.random.Generator) -> nir.LIF:
    """snntorch.Leaky(beta) -> LIF(tau = dt / (1 - beta), r = tau / dt, v_leak = 0): per-neuron beta here."""
    beta = rng.uniform(0.5, 0.95, n)
    tau = DT / (1 - beta)
    return nir.LIF(tau=tau, r=tau / DT, v_leak=np.zeros(n), v_threshold=rng.uniform(0.5, 1.5, n),
                   v_reset=np.zeros(n))


def _norse_cuba(n: int, rng: np.random.Generator) -> nir.CubaLIF:
    """norse LIF (current based): tau_syn, tau_mem from the inverse time constants, r = 1, w_in scaling the input."""
    return nir.CubaLIF(tau_syn=rng.uniform(2e-4, 8e-4, n), tau_mem=rng.uniform(2e-4, 1e-3, n), r=np.ones(n),
                       v_leak=rng.uniform(-0.1, 0.1, n), v_threshold=rng.uniform(0.1, 0.3, n),
                       v_reset=np.zeros(n), w_in=rng.uniform(1.0, 3.0, n))


@pytest.mark.parametrize("backend", BACKENDS)
def test_snntorch_and_norse_style_graph_matches_nir_equations(backend: str) -> None:
    rng = _rng(1)
    a1 = nir.Affine(weight=rng.normal(size=(6, 4)), bias=rng.normal(size=6) * 0.1)
    lif = _snntorch_lif(6, rng)
    a2 = nir.Linear(weight=rng.normal(size=(5, 6)))
    cuba = _norse_cuba(5, rng)
    x = rng.uniform(0, 1.5, size=(12, 3, 4))
    expected = _cuba(_affine(_lif(_affine(x, a1), lif), a2), cuba)
    model = from_nir(_graph(a1, lif, a2, cuba), dtype=F64, backend=backend)
    assert not model.recurrent
    got = _run(model, x)
    assert expected.sum() > 5 and np.array_equal(got, expected)
    model.reset()  # one step at a time gives the same
    model.step_mode = "s"
    with torch.no_grad():
        assert np.array_equal(np.stack([model(torch.as_tensor(x_t)).numpy() for x_t in x]), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_method_matches_exact_solution(backend: str) -> None:
    rng = _rng(2)
    lif = nir.LIF(tau=rng.uniform(1e-4, 5e-4, 7), r=rng.uniform(0.5, 2, 7), v_leak=rng.uniform(-0.2, 0.2, 7),
                  v_threshold=np.full(7, 0.8), v_reset=np.full(7, -0.1))
    x = rng.uniform(0, 2, size=(10, 2, 7))
    expected = _lif(x, lif, method="exact")
    assert expected.sum() > 5
    assert np.array_equal(_run(_graph(lif), x, method="exact", backend=backend), expected)
    assert not np.array_equal(_run(_graph(lif), x, method="euler", backend=backend), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrent_graph_steps_through_time(backend: str) -> None:
    """input -> affine -> lif -> output, and lif -> w_rec -> lif: lif sees W x[t] + b + W_rec s[t-1]."""
    rng = _rng(3)
    affine, lif = nir.Affine(weight=rng.normal(size=(5, 3)), bias=np.zeros(5)), _snntorch_lif(5, rng)
    w_rec = nir.Linear(weight=rng.normal(size=(5, 5)))
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([3])), "fc": affine, "lif": lif, "w_rec": w_rec,
                                "output": nir.Output(np.array([5]))},
                         edges=[("input", "fc"), ("fc", "lif"), ("lif", "w_rec"), ("w_rec", "lif"),
                                ("lif", "output")], type_check=False)
    x = rng.uniform(0, 1, size=(15, 2, 3))
    s, expected = np.zeros((2, 5)), []
    v = np.zeros((2, 5))
    for x_t in x:
        v = v + DT / lif.tau * (lif.r * (_affine(x_t, affine) + s @ w_rec.weight.T) - v)
        s = (v > lif.v_threshold).astype(float)
        v = np.where(s > 0, 0.0, v)
        expected.append(s)
    model = from_nir(graph, dtype=F64, backend=backend)
    assert model.recurrent
    assert np.array_equal(_run(model, x), np.stack(expected))
    model.reset()  # step by step gives the same
    model.step_mode = "s"
    with torch.no_grad():
        steps = np.stack([model(torch.as_tensor(x_t)).numpy() for x_t in x])
    assert np.array_equal(steps, np.stack(expected))


def test_subgraph_is_inlined() -> None:
    """snnTorch exports a recurrent layer (RLeaky) as a subgraph {input, lif, w_rec, output}."""
    rng = _rng(4)
    lif, w_rec = _snntorch_lif(4, rng), nir.Linear(weight=rng.normal(size=(4, 4)))
    inner = nir.NIRGraph(nodes={"input": nir.Input(np.array([4])), "lif": lif, "w_rec": w_rec,
                                "output": nir.Output(np.array([4]))},
                         edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")],
                         type_check=False)
    outer = nir.NIRGraph(nodes={"input": nir.Input(np.array([4])), "rlif": inner, "output": nir.Output(np.array([4]))},
                         edges=[("input", "rlif"), ("rlif", "output")], type_check=False)
    x = rng.uniform(0, 1, size=(8, 2, 4))
    assert np.array_equal(_run(outer, x), _run(inner, x))
    assert from_nir(outer).recurrent


# -- non-spiking and stateless nodes ---------------------------------------------------------------------------------
def test_non_spiking_neurons_output_their_state() -> None:
    rng = _rng(5)
    n = 4
    li = nir.LI(tau=rng.uniform(2e-4, 5e-4, n), r=rng.uniform(0.5, 2, n), v_leak=rng.uniform(-1, 1, n))
    integrator = nir.I(r=rng.uniform(100, 1000, n))
    cuba_li = nir.CubaLI(tau_syn=rng.uniform(2e-4, 5e-4, n), tau_mem=rng.uniform(2e-4, 5e-4, n),
                         r=rng.uniform(0.5, 2, n), v_leak=rng.uniform(-1, 1, n), w_in=rng.uniform(0.5, 2, n))
    x = rng.normal(size=(9, 3, n))
    v, li_expected = np.broadcast_to(li.v_leak, x.shape[1:]), []
    for x_t in x:
        v = v + DT / li.tau * (li.v_leak - v + li.r * x_t)
        li_expected.append(v)
    np.testing.assert_allclose(_run(_graph(li), x), np.stack(li_expected), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_run(_graph(integrator), x), np.cumsum(DT * integrator.r * x, 0), rtol=1e-12)
    np.testing.assert_allclose(_run(_graph(cuba_li), x), _cuba(x, cuba_li, spiking=False), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_run(_graph(cuba_li), x, method="semi_implicit"),
                               _cuba(x, cuba_li, spiking=False, current_first=True), rtol=1e-12, atol=1e-12)


def test_non_spiking_exact_matches_fused_spec() -> None:
    """CubaLI with method 'exact' (a torch module) against CubaLIF's exact spec with a threshold never reached."""
    rng = _rng(6)
    fields = {"tau_syn": rng.uniform(2e-4, 5e-4, 3), "tau_mem": rng.uniform(2e-4, 5e-4, 3), "r": np.ones(3),
              "v_leak": np.zeros(3), "w_in": np.ones(3)}
    fields["tau_syn"][0] = fields["tau_mem"][0]  # the equal-time-constant branch
    x = rng.uniform(0, 1, size=(6, 2, 3))
    li = from_nir(_graph(nir.CubaLI(**fields)), dtype=F64, method="exact")
    lif = from_nir(_graph(nir.CubaLIF(**fields, v_threshold=np.full(3, 1e9))), dtype=F64, method="exact")
    with torch.no_grad():
        got = li(torch.as_tensor(x))
        lif(torch.as_tensor(x))
    np.testing.assert_allclose(got[-1].numpy(), lif.module("n0").v.numpy(), rtol=1e-10)


def test_threshold_scale_delay_pooling_conv_flatten() -> None:
    rng = _rng(7)
    conv = nir.Conv2d(input_shape=(6, 6), weight=rng.normal(size=(2, 1, 3, 3)), stride=1, padding=1, dilation=1,
                      groups=1, bias=rng.normal(size=2))
    sum_pool = nir.SumPool2d(kernel_size=np.array([2, 2]), stride=np.array([2, 2]), padding=np.array([0, 0]))
    avg_pool = nir.AvgPool2d(kernel_size=np.array([3, 3]), stride=np.array([3, 3]), padding=np.array([0, 0]))
    flatten = nir.Flatten(input_type={"input": np.array([2, 1, 1])}, start_dim=0, end_dim=-1)
    scale = nir.Scale(scale=np.array([2.0, -1.0]))
    threshold = nir.Threshold(threshold=np.array([0.1, 0.2]))
    delay = nir.Delay(delay=np.array([0.0, 2 * DT]))
    x = rng.normal(size=(5, 2, 1, 6, 6))
    t = torch.as_tensor(x).flatten(0, 1)
    y = torch.nn.functional.conv2d(t, torch.as_tensor(conv.weight), torch.as_tensor(conv.bias), padding=1)
    y = torch.nn.functional.avg_pool2d(y, 2) * 4
    y = torch.nn.functional.avg_pool2d(y, 3).flatten(1) * torch.tensor([2.0, -1.0], dtype=F64)
    y = (y > torch.tensor([0.1, 0.2], dtype=F64)).to(F64).unflatten(0, (5, 2)).numpy()
    expected = y.copy()
    expected[:, :, 1] = np.concatenate([np.zeros((2, 2)), y[:-2, :, 1]])  # the second neuron two steps late
    got = _run(_graph(conv, sum_pool, avg_pool, flatten, scale, threshold, delay), x)
    assert y.sum() > 0 and np.array_equal(got, expected)


# -- SpikingJelly 2.0's exporter and importer --------------------------------------------------------------------
def _sj_net(decay_input: bool):
    neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
    layer = pytest.importorskip("spikingjelly.activation_based.layer")
    torch.manual_seed(0)
    return nn.Sequential(layer.Linear(5, 8), neuron.LIFNode(tau=3.0, decay_input=decay_input, v_reset=-0.1),
                         layer.Linear(8, 4), neuron.IFNode(v_threshold=0.8)).double()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decay_input", [True, False])
def test_spikingjelly_export_loads_with_same_outputs(backend: str, decay_input: bool, tmp_path: Path) -> None:
    nir_exchange = pytest.importorskip("spikingjelly.activation_based.nir_exchange")
    functional = pytest.importorskip("spikingjelly.activation_based.functional")
    net = _sj_net(decay_input)
    nir_exchange.export_to_nir(net, torch.rand(2, 5, dtype=F64), save_path=tmp_path / "sj.nir", dt=DT)
    x = torch.rand(16, 3, 5, dtype=F64) * 2
    functional.set_step_mode(net, "m")
    functional.reset_net(net)
    with torch.no_grad():
        expected = net(x).numpy()
    got = _run(from_nir(tmp_path / "sj.nir", dtype=F64, backend=backend), x.numpy())
    assert expected.sum() > 3 and np.array_equal(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spikingjelly_cuba_lif_loads_with_semi_implicit_method(backend: str) -> None:
    """SpikingJelly's CUBALIFNode (and snnTorch's Synaptic) step the current first: method='semi_implicit'."""
    nir_exchange = pytest.importorskip("spikingjelly.activation_based.nir_exchange")
    functional = pytest.importorskip("spikingjelly.activation_based.functional")
    neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
    layer = pytest.importorskip("spikingjelly.activation_based.layer")
    torch.manual_seed(4)
    net = nn.Sequential(layer.Linear(4, 6), neuron.CUBALIFNode(c_decay=0.6, v_decay=0.8, v_threshold=0.7,
                                                               v_reset=0.0)).double()
    graph = nir_exchange.export_to_nir(net, torch.rand(2, 4, dtype=F64), dt=DT)
    x = torch.rand(12, 3, 4, dtype=F64)
    functional.set_step_mode(net, "m")
    functional.reset_net(net)
    with torch.no_grad():
        expected = net(x).numpy()
    cuba = next(node for node in graph.nodes.values() if isinstance(node, nir.CubaLIF))
    direct = _cuba(_affine(x.numpy(), next(n for n in graph.nodes.values() if isinstance(n, nir.Affine))), cuba,
                   current_first=True)
    got = _run(from_nir(graph, dtype=F64, method="semi_implicit", backend=backend), x.numpy())
    assert expected.sum() > 3 and np.array_equal(got, expected) and np.array_equal(direct, expected)
    assert not np.array_equal(_run(graph, x.numpy(), backend=backend), expected)  # euler lags the current


def test_spikingjelly_imports_our_export() -> None:
    nir_exchange = pytest.importorskip("spikingjelly.activation_based.nir_exchange")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 7), LIFNode(tau=2.5, v_reset=0.0), nn.Linear(7, 3), IFNode()).double()
    graph = to_nir(model, torch.rand(2, 5, dtype=F64), dt=DT)
    theirs = nir_exchange.import_from_nir(graph, dt=DT, dtype=F64)
    x = torch.rand(10, 2, 5, dtype=F64) * 2
    ours, state, expected = [], None, []
    with torch.no_grad():
        for x_t in x:
            ours.append(model(x_t))
            out, state = theirs(x_t, state)
            expected.append(out)
    assert torch.stack(expected).sum() > 3 and torch.equal(torch.stack(ours), torch.stack(expected))


# -- round trips ---------------------------------------------------------------------------------------------------
def _steps(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([model(x_t) for x_t in x])


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_through_a_file(backend: str, tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), LIFNode(tau=2.0, v_threshold=0.5, backend=backend),
                          nn.AvgPool2d(2), nn.Flatten(), nn.Linear(48, 6, bias=False),
                          Neuron("lif", tau=torch.linspace(1.5, 4.0, 6), options={"decay_input": False},
                                 backend=backend),
                          nn.Linear(6, 3), IFNode(v_reset=-0.2, backend=backend), nn.Linear(3, 3),
                          ParametricLIFNode(init_tau=3.0, v_threshold=0.3, backend=backend)).double()
    x = torch.rand(8, 2, 1, 8, 8, dtype=F64) * 2
    expected = _steps(model, x)
    nir.write(tmp_path / "model.nir", to_nir(model, x[0], dt=DT))
    got = _run(from_nir(tmp_path / "model.nir", dtype=F64, backend=backend), x.numpy())
    assert expected.sum() > 3 and np.array_equal(got, expected.numpy())


def test_round_trip_of_cuba_lif_with_exact_method(tmp_path: Path) -> None:
    """The shipped cuba_lif integrates exactly: re-imported with method='exact' it gives the same outputs."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 5), Neuron("cuba_lif", tau=3.0, tau_syn=torch.linspace(2.0, 6.0, 5),
                                                  v_threshold=0.3, time_step=0.5)).double()
    x = torch.rand(12, 2, 4, dtype=F64)
    expected = _steps(model, x)
    nir.write(tmp_path / "cuba.nir", to_nir(model, x[0], dt=DT))
    got = _run(from_nir(tmp_path / "cuba.nir", dtype=F64, method="exact"), x.numpy())
    assert expected.sum() > 3 and np.array_equal(got, expected.numpy())


def test_a_module_used_twice_exports_a_node_per_use() -> None:
    """A shared Linear is a node per use, each with its own copy of the weights (the model's never shared); a
    shared neuron (one state for both uses) is refused. Found: the second use was left out of the graph."""
    lin = nn.Linear(4, 4)
    with torch.no_grad():  # a silent input gives 5 (a spike), a spike 2: the second layer depends on the first
        lin.weight.copy_(-3 * torch.eye(4))
        lin.bias.fill_(5.0)
    strict = dataclasses.replace(load_spec("lif"), fires_at=">")  # NIR's comparison: an exact round trip
    model = nn.Sequential(lin, Neuron(strict, tau=2.0), lin, Neuron(strict, tau=2.0)).double()
    x = torch.rand(8, 2, 4, dtype=F64) * 3
    graph = to_nir(model, x[0], dt=DT)
    assert list(graph.nodes) == ["input", "0", "1", "2", "3", "output"]
    assert graph.edges == [("input", "0"), ("0", "1"), ("1", "2"), ("2", "3"), ("3", "output")]
    weights = [graph.nodes[name].weight for name in ("0", "2")]
    assert not np.shares_memory(*weights) and not np.shares_memory(weights[0], lin.weight.detach().numpy())
    expected = _steps(model, x)
    assert expected.sum() > 3 and np.array_equal(_run(graph, x.numpy()), expected.numpy())
    lif = LIFNode()
    with pytest.raises(NIRError, match=r"module '3' \(LIFNode\) is a stateful module used a second time"):
        to_nir(nn.Sequential(nn.Linear(4, 4), lif, nn.Linear(4, 4), lif), torch.rand(2, 4))


def test_a_monitor_sees_nothing_of_an_export() -> None:
    """The export's sample step runs without the modules' hooks: a Monitor records the model's runs alone and gives
    store_v_seq back at remove(). Found: it recorded the sample step, and store_v_seq stayed True."""
    net = nn.Sequential(nn.Linear(3, 4), LIFNode(step_mode="m", backend="reference"))
    x = torch.rand(5, 2, 3)
    with Monitor(net) as monitor:
        net(x)
        to_nir(net, x[0])
    assert [tuple(r.shape) for r in monitor.records["1"]["spike"]] == [(5, 2, 4)]
    assert net[1].store_v_seq is False and net[1].step_mode == "m"


def test_round_trip_of_an_imported_recurrent_graph(tmp_path: Path) -> None:
    rng = _rng(8)
    lif, w_rec = _snntorch_lif(4, rng), nir.Linear(weight=rng.normal(size=(4, 4)))
    graph = _graph(nir.Affine(weight=rng.normal(size=(4, 3)), bias=np.zeros(4)), lif, nir.LI(
        tau=np.full(4, 3e-4), r=np.ones(4), v_leak=np.zeros(4)), edges=[("n1", "rec"), ("rec", "n1")])
    graph.nodes["rec"] = w_rec
    model = from_nir(graph, dtype=F64)
    x = rng.uniform(0, 1, size=(10, 2, 3))
    expected = _run(model, x)
    model.reset()
    nir.write(tmp_path / "rec.nir", to_nir(model, torch.as_tensor(x[0])))
    np.testing.assert_array_equal(_run(from_nir(tmp_path / "rec.nir", dtype=F64), x), expected)
    np.testing.assert_array_equal(_run(model, x), expected)  # exporting left the model's states alone


METHODS = ["euler", "semi_implicit", "exact"]


def _gradient_case(recurrent: bool) -> tuple[nir.NIRGraph, torch.Tensor]:
    """A graph of two neuron layers (with a recurrent edge or not) and its input."""
    rng = _rng(10)
    graph = _graph(nir.Affine(weight=rng.normal(size=(5, 3)), bias=np.zeros(5)), _snntorch_lif(5, rng),
                   nir.Affine(weight=rng.normal(size=(4, 5)), bias=np.full(4, 0.5)), _norse_cuba(4, rng),
                   edges=[("n3", "rec"), ("rec", "n3")] if recurrent else [])
    if recurrent:
        graph.nodes["rec"] = nir.Linear(weight=rng.normal(size=(4, 4)))
    return graph, torch.as_tensor(rng.uniform(0, 2, size=(8, 2, 3)))


def _gradient_run(graph: nir.NIRGraph, x: torch.Tensor, method: str, backend: str) -> tuple[NIRModule, list]:
    model = from_nir(graph, dtype=F64, method=method, backend=backend)
    x_b = x.clone().requires_grad_()
    out = model(x_b)
    (out * torch.linspace(0.5, 1.5, out.numel(), dtype=F64).view(out.shape)).sum().backward()
    return model, [x_b.grad, *(p.grad for p in model.parameters())]


@pytest.fixture(scope="module", autouse=True)
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The host kernels of the gradient test's graphs and of the other tests' host runs (their calls, run with the
    launches recorded), compiled up front many to a compiler run (`conftest.compile_launched`): each would compile
    its own in a compiler run of their own."""
    if toolchain.missing() is not None:
        return 0
    cases = [(*_gradient_case(recurrent), method) for recurrent in (False, True) for method in METHODS]
    calls = [functools.partial(_gradient_run, graph, x, method, "host") for graph, x, method in cases]
    calls += [functools.partial(test, "host") for test in (
        test_snntorch_and_norse_style_graph_matches_nir_equations, test_exact_method_matches_exact_solution,
        test_spikingjelly_cuba_lif_loads_with_semi_implicit_method)]
    calls += [functools.partial(test_round_trip_through_a_file, "host", tmp_path_factory.mktemp("nir")),
              *(functools.partial(test_spikingjelly_export_loads_with_same_outputs, "host", decay_input,
                                  tmp_path_factory.mktemp("nir")) for decay_input in (True, False))]
    return compile_launched(*calls)


@NEEDS_HOST
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("recurrent", [False, True])
def test_gradients_of_host_kernels_match_reference(method: str, recurrent: bool) -> None:
    """Backward through the generated kernels (fused over T, or single steps in a recurrent graph)."""
    graph, x = _gradient_case(recurrent)
    grads = []
    for backend in ("reference", "host"):
        model, model_grads = _gradient_run(graph, x, method, backend)
        assert model.recurrent is recurrent
        grads.append(model_grads)
    assert grads[0][0].abs().sum() > 0
    for ours, reference in zip(grads[1], grads[0]):
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_path_equals_step_by_step_path_with_gradients(backend: str) -> None:
    """A graph without cycles runs each Affine once over [T * B, *] and each neuron over [T, B, *]; stepping it
    one time step at a time gives the same spikes and the same gradients of the input and every weight."""
    rng = _rng(11)
    graph = _graph(nir.Affine(weight=rng.normal(size=(6, 4)), bias=rng.normal(size=6) * 0.1), _snntorch_lif(6, rng),
                   nir.Linear(weight=rng.normal(size=(5, 6))), _norse_cuba(5, rng))
    x = torch.as_tensor(rng.uniform(0, 2, size=(10, 3, 4)))
    scale = torch.linspace(0.5, 1.5, 10 * 3 * 5, dtype=F64).view(10, 3, 5)
    results = []
    for step_mode in ("m", "s"):
        model = from_nir(graph, dtype=F64, backend=backend, step_mode=step_mode)
        x_b = x.clone().requires_grad_()
        out = model(x_b) if step_mode == "m" else torch.stack([model(x_t) for x_t in x_b])
        (out * scale).sum().backward()
        results.append([out.detach(), x_b.grad, *(p.grad for p in model.parameters())])
    assert results[0][0].sum() > 5 and results[0][1].abs().sum() > 0
    for folded, stepped in zip(*results):
        torch.testing.assert_close(folded, stepped, rtol=1e-12, atol=1e-14)


def test_training_through_an_imported_graph() -> None:
    """Gradients reach the weights of an imported graph (the surrogate of each spiking layer)."""
    rng = _rng(9)
    graph = _graph(nir.Affine(weight=rng.normal(size=(6, 4)), bias=np.zeros(6)), _snntorch_lif(6, rng),
                   nir.Affine(weight=rng.normal(size=(2, 6)), bias=np.zeros(2)),
                   nir.LI(tau=np.full(2, 5e-4), r=np.ones(2), v_leak=np.zeros(2)))
    model = from_nir(graph, dtype=F64)
    model(torch.rand(5, 3, 4, dtype=F64)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# -- refusals --------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Mystery(nir.NIRNode):
    gain: np.ndarray

    def __post_init__(self) -> None:
        self.input_type = {"input": np.array(self.gain.shape)}
        self.output_type = {"output": np.array(self.gain.shape)}


def _lif_node(n: int = 2, **changes) -> nir.LIF:
    fields = {"tau": np.full(n, 2e-4), "r": np.ones(n), "v_leak": np.zeros(n), "v_threshold": np.ones(n),
              "v_reset": np.zeros(n), **changes}
    return nir.LIF(**fields)


@pytest.mark.parametrize("make, options, message", [
    (lambda: _graph(Mystery(np.ones(2))), {}, "node 'n0' has NIR type Mystery"),
    (lambda: _graph(_lif_node()), {"dt": 0.0}, "dt: the time step must be positive"),
    (lambda: _graph(_lif_node()), {"method": "rk4"}, "method: expected one of euler, semi_implicit, exact"),
    (lambda: _graph(_lif_node(tau=np.array([2e-4, -1.0]))), {}, r"node 'n0' \(LIF\): field 'tau': must be positive"),
    (lambda: _graph(nir.Delay(delay=np.array([1.5e-4]))), {}, r"node 'n0' \(Delay\): delay / dt must be whole"),
    (lambda: _graph(nir.Affine(weight=np.ones((2, 3, 4)), bias=np.zeros((2, 3)))), {}, "field .weight.: must be 2-D"),
    (lambda: nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), "a": _lif_node(), "b": _lif_node(),
                                 "output": nir.Output(np.array([2]))},
                          edges=[("input", "a"), ("a", "output"), ("b", "a")], type_check=False), {},
     "node 'b' cannot be reached from the inputs"),
    (lambda: nir.NIRGraph(nodes={"a": _lif_node(), "output": nir.Output(np.array([2]))}, edges=[("a", "output")],
                          type_check=False), {}, "graph: no Input node"),
    (lambda: "not a graph", {}, "No such file|Unable to"),
    (lambda: 3, {}, "graph: expected a nir.NIRGraph"),
])
def test_import_refusals(make, options, message) -> None:
    with pytest.raises((ValueError, TypeError, OSError, FileNotFoundError), match=message):
        from_nir(make(), **options)


def test_module_refusals() -> None:
    model = from_nir(nir.NIRGraph(nodes={"a": nir.Input(np.array([2])), "b": nir.Input(np.array([2])),
                                         "output": nir.Output(np.array([2]))},
                                  edges=[("a", "output"), ("b", "output")], type_check=False))
    with pytest.raises(ValueError, match=r"x: this graph has inputs \['a', 'b'\]"):
        model(torch.zeros(3, 1, 2))
    with pytest.raises(ValueError, match="x: missing input 'b'"):
        model({"a": torch.zeros(3, 1, 2)})
    assert torch.equal(model({"a": torch.ones(3, 1, 2), "b": torch.ones(3, 1, 2)}), torch.full((3, 1, 2), 2.0))
    with pytest.raises(ValueError, match="step_mode: expected 's'"):
        model.step_mode = "x"


@pytest.mark.parametrize("module, message", [
    (Neuron("qif"), "module '1': neuron spec 'qif' has no NIR equivalent"),
    (LIFNode(v_reset=None), "soft reset"),
    (nn.ReLU(), "module '1': ReLU has no NIR equivalent"),
    (Neuron(NeuronSpec(name="lif", params={"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0},
                       charge="v + x * x / tau")), "neuron spec 'lif' is not the shipped 'lif'"),
    (nn.Conv1d(4, 4, 1, padding_mode="circular"), "padding_mode='circular'"),
    # NIR stores no initial state: one the import would not start from is refused (it was exported silently)
    (SimpleIFNode(v_reset=0.5), r"module '1': 'if' layer: state 'v' starts at 0, where an import of its NIR IF "
                                r"starts at v_reset = 0.5: NIR stores no initial state"),
    (Neuron("lif", initial={"v": 3.0}), r"'lif' layer: state 'v' starts at 3, where an import of its NIR LIF starts "
                                        r"at v_leak = 0"),
    (Neuron("cuba_lif", v_reset=0.2), r"'cuba_lif' layer: state 'v' starts at 0.2, where .* starts at v_leak = 0"),
    (Neuron("cuba_lif", initial={"i": torch.tensor([0.0, 0.0, 0.0, 1.0])}),
     r"state 'i' starts at per-neuron values, where an import of its NIR CubaLIF starts at 0 = 0"),
    # NIR's Flatten keeps the batch apart: torch's start_dim=0 (or -2 of [B, 4]) flattens it (it was exported as
    # NIR's start_dim 0, the first dimension after the batch)
    (nn.Flatten(0), r"module '1': Flatten\(start_dim=0, end_dim=-1\) of an input \[B, 4\] flattens the "
                    "batch dimension"),
    (nn.Flatten(-2), "flattens the batch dimension"),
])
def test_export_refusals(module: nn.Module, message: str) -> None:
    model = nn.Sequential(nn.Linear(3, 4), module).double()
    sample = torch.rand(2, 4, 1, dtype=F64) if isinstance(module, nn.Conv1d) else torch.rand(2, 3, dtype=F64)
    if isinstance(module, nn.Conv1d):
        model = nn.Sequential(nn.Identity(), module).double()
    with pytest.raises(NIRError, match=message):
        to_nir(model, sample)


def test_export_refuses_bad_arguments() -> None:
    model = nn.Sequential(nn.Linear(3, 4))
    with pytest.raises(ValueError, match="dt: the time step must be positive"):
        to_nir(model, torch.rand(2, 3), dt=-1.0)
    # a time step that is no positive, finite number of seconds (inf was written as tau = inf, True as 1 s)
    for dt, message in ((float("inf"), "positive and finite"), (float("nan"), "positive and finite"),
                        (True, "a number of seconds, got bool"), ("1e-4", "a number of seconds, got str")):
        with pytest.raises(NIRError, match=f"dt: the time step must be {message}"):
            to_nir(nn.Sequential(nn.Linear(3, 4), LIFNode()), torch.rand(2, 3), dt=dt)
    with pytest.raises(ValueError, match=r"sample_input: expected one time step"):
        to_nir(model, torch.rand(3))
    with pytest.raises(ValueError, match="AvgPool2d with ceil_mode"):
        to_nir(nn.AvgPool2d(2, ceil_mode=True), torch.rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match="nothing to export"):
        to_nir(nn.Sequential(nn.Identity()), torch.rand(1, 3))


# -- the benchmark script ----------------------------------------------------------------------------------------
def test_benchmark_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The script run as `__main__` in this process (a fresh interpreter would add only its imports)."""
    script = Path(__file__).resolve().parents[1] / "bench" / "nir_mlp.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--out", str(tmp_path), "--device", "cpu", "--steps", "2",
                                      "--warmup", "1", "--batch", "4", "--time-steps", "3", "--hidden", "16"])
    with torch.random.fork_rng(), pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script), run_name="__main__")
    assert stop.value.code == 0, capsys.readouterr().err[-2000:]
    rows = {row["system"]: row for row in json.loads((tmp_path / "nir_mlp.json").read_text())["rows"]}
    assert rows["ours"]["median_step_ms"] > 0 and "ours" in capsys.readouterr().out
    for row in rows.values():  # each system ran the same graph: the same spikes (or it says why it was skipped)
        assert "skipped" in row or row["spike_agreement_with_first"] == 1.0
