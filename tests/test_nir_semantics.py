"""NIR semantics under unusual but valid graphs (a probe): imports against a direct float64 simulation of NIR's
equations as docs/nir.md says we discretise them (tests/nir_reference.py: Euler, spike where v > v_threshold, hard
reset; the exact solution for method="exact"), exports of every layer class that claims NIR support imported
again through a file, and the faults the probe found:

- the exact step of CubaLIF (autocuda.spec.ode, a two-state triangular system) was NaN where the synapse is much
  faster than the membrane ((1/tau_syn - 1/tau_mem) dt beyond exp's range: e^{(a - d) dt} - 1 = inf times
  e^{d dt} = 0), and the fix keeps the reference's parameter gradients finite;
- the exact step of the non-spiking CubaLI (autocuda.nir.modules) lost digits for nearly equal time constants
  (1e-7 relative in float64, 1e-2 in float32), where the spec keeps them;
- to_nir wrote layers that step NIR's equations with their own dt (an import's neurons, LI, I, CubaLI, Delay)
  into a graph for another dt, which imported with that dt is another network: now refused, naming the module.

Everything runs on CPU in float64 (float32 where the fault was), on the torch reference and the generated CUDA
compiled for the CPU (the host runner).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

nir = pytest.importorskip("nir")

from backends import CPU_BACKENDS, NEEDS_HOST  # noqa: E402
from conftest import profile  # noqa: E402
from nir_reference import simulate  # noqa: E402

from autocuda.base.errors import NIRError  # noqa: E402
from autocuda.nn import IFNode, LIFNode, Neuron, ParametricLIFNode  # noqa: E402
from autocuda.nn.spikingjelly_more import SimpleIFNode, SimpleLIFNode  # noqa: E402
from autocuda.tools.nir import from_nir, to_nir  # noqa: E402
from autocuda.tools.nir.specs import nir_spec  # noqa: E402

DT = 1e-4
F64 = torch.float64


def _graph(nodes: dict, edges: list, shape) -> nir.NIRGraph:
    return nir.NIRGraph(nodes={"input": nir.Input(np.array(shape)), **nodes, "output": nir.Output(np.array(shape))},
                        edges=edges, type_check=False)


def _chain(node, shape) -> nir.NIRGraph:
    return _graph({"n": node}, [("input", "n"), ("n", "output")], shape)


def _run(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(x)).numpy()


def _both_modes(graph, x: np.ndarray, backend: str, **options) -> tuple[np.ndarray, np.ndarray]:
    """The import's outputs over the sequence at once and one step at a time."""
    model = from_nir(graph, dt=DT, dtype=F64, backend=backend, **options)
    whole = _run(model, x)
    model.reset()
    model.step_mode = "s"
    return whole, np.stack([_run(model, x_t) for x_t in x])


def _stable_phi(tau_mem: np.ndarray, tau_syn: np.ndarray, dt: float) -> np.ndarray:
    """(e^{-dt/tau_mem} - e^{-dt/tau_syn}) / (1/tau_syn - 1/tau_mem), from the larger rate (no overflow, no
    cancellation): e^{max rate dt} dt expm1(z)/z, z = -|1/tau_syn - 1/tau_mem| dt."""
    z = -np.abs(tau_mem - tau_syn) / (tau_mem * tau_syn) * dt
    with np.errstate(invalid="ignore", divide="ignore"):
        exprel = np.where(z == 0, 1.0, np.expm1(z) / z)
    return np.maximum(np.exp(-dt / tau_mem), np.exp(-dt / tau_syn)) * dt * exprel


def _exact_cuba(x: np.ndarray, node, dt: float, spiking: bool = True) -> np.ndarray:
    """NIR's CubaLIF (CubaLI) integrated exactly with x held over each step: outputs spikes (the membrane)."""
    f = {k: np.asarray(getattr(node, k), np.float64) for k in ("tau_syn", "tau_mem", "r", "v_leak", "w_in")}
    v, i, out = np.broadcast_to(f["v_leak"], x.shape[1:]).copy(), np.zeros(x.shape[1:]), []
    ea, ed = np.exp(-dt / f["tau_mem"]), np.exp(-dt / f["tau_syn"])
    phi = _stable_phi(f["tau_mem"], f["tau_syn"], dt)
    for x_t in x:
        i_star = f["w_in"] * x_t
        v_star = f["v_leak"] + f["r"] * i_star
        v = v_star + (v - v_star) * ea + f["r"] / f["tau_mem"] * phi * (i - i_star)
        i = i_star + (i - i_star) * ed
        if spiking:
            z = v > node.v_threshold
            v = np.where(z, node.v_reset, v)
            out.append(z.astype(np.float64))
        else:
            out.append(v)
    return np.stack(out)


# -- faults found -------------------------------------------------------------------------------------------------
FAST_SYNAPSE = (np.array([1e-7, 1e-2, 1e-5, 2e-3]), np.array([1e-2, 1e-7, 1e-2, 2e-3]))  # tau_syn, tau_mem (s)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_cuba_lif_with_a_fast_synapse_is_finite(backend: str, dtype: torch.dtype) -> None:
    """dt / tau_syn = 1e4 (float64) or 100 (float32): e^{(a - d) dt} overflowed, times e^{d dt} = 0: NaN membranes."""
    tau_syn, tau_mem = FAST_SYNAPSE
    n, dt = 4, 1e-3
    node = nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau_mem, r=np.full(n, 1.5), v_leak=np.full(n, 0.1),
                       v_threshold=np.full(n, 0.5), v_reset=np.zeros(n), w_in=np.full(n, 0.8))
    x = np.random.default_rng(0).uniform(0, 2, (12, 3, n))
    model = from_nir(_chain(node, [n]), dt=dt, dtype=dtype, method="exact", backend=backend)
    layer = model.module("n")
    layer.store_v_seq = True
    with torch.no_grad():
        spikes = model(torch.as_tensor(x, dtype=dtype)).double().numpy()
    assert np.isfinite(layer.v_seq.double().numpy()).all()
    if dtype == torch.float64:
        expected = _exact_cuba(x, node, dt)
        assert spikes.sum() > 0
        np.testing.assert_array_equal(spikes, expected)


@NEEDS_HOST
def test_exact_cuba_lif_parameter_gradients_are_finite_and_agree() -> None:
    """The reference's autograd (torch.where over the branches) and the derived backward of the host kernels give
    the same finite gradients of learnable time constants, fast synapse and equal time constants included."""
    grads = {}
    for backend in ("reference", "host"):
        tau_syn, tau_mem = (nn.Parameter(torch.tensor(t, dtype=F64)) for t in FAST_SYNAPSE)
        layer = Neuron(nir_spec("CubaLIF", "exact"), step_mode="m", backend=backend, time_step=1e-3, tau_syn=tau_syn,
                       tau_mem=tau_mem, r=1.0, v_leak=0.0, v_threshold=0.5, v_reset=0.0, w_in=1.0)
        x = torch.as_tensor(np.random.default_rng(1).uniform(0, 3, (8, 2, 4)))
        layer(x).sum().backward()
        assert tau_syn.grad is not None and tau_mem.grad is not None
        grads[backend] = torch.cat([tau_syn.grad, tau_mem.grad])
        assert torch.isfinite(grads[backend]).all(), backend
    torch.testing.assert_close(grads["reference"], grads["host"], rtol=1e-8, atol=0)


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_exact_cubali_keeps_its_digits_for_nearly_equal_time_constants(dtype: torch.dtype, rtol: float) -> None:
    """(ea - ed)/(a - d) cancelled: 1e-7 relative error in float64, 1e-2 in float32, for time constants 1e-7 and
    1e-5 apart. The judge: the closed form from rest under a constant input, evaluated in float64."""
    n, steps = 5, 20
    tau_mem = np.full(n, 1e-3)
    tau_syn = tau_mem * (1 + np.array([0.0, 1e-7, 1e-5, 1e-3, 1e-1]))
    node = nir.CubaLI(tau_syn=tau_syn, tau_mem=tau_mem, r=np.ones(n), v_leak=np.zeros(n), w_in=np.ones(n))
    model = from_nir(_chain(node, [n]), dt=DT, dtype=dtype, method="exact")
    got = _run(model, np.ones((steps, 1, n), dtype=np.float32 if dtype == torch.float32 else np.float64))[:, 0]
    t = DT * np.arange(1, steps + 1)[:, None]
    # v = 1 - (tm e^{-t/tm} - ts e^{-t/ts}) / (tm - ts), written without cancellation, with d = 1/ts - 1/tm:
    # v = 1 - e^{-t/tm} - (t/tm) e^{-t/tm} exprel(-d t), exprel(z) = (e^z - 1)/z
    z = -(tau_mem - tau_syn) / (tau_mem * tau_syn) * t
    with np.errstate(invalid="ignore", divide="ignore"):
        exprel = np.where(z == 0, 1.0, np.expm1(z) / z)
    expected = 1 - np.exp(-t / tau_mem) - t / tau_mem * np.exp(-t / tau_mem) * exprel
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=0)


def _graph_with_a_dt(dt: float) -> nir.NIRGraph:
    n = 3
    nodes = {"a": nir.Affine(np.random.default_rng(2).normal(size=(n, 2)), np.zeros(n)),
             "lif": nir.LIF(tau=np.full(n, 5e-3), r=np.ones(n), v_leak=np.zeros(n), v_threshold=np.ones(n),
                            v_reset=np.zeros(n)),
             "delay": nir.Delay(np.full(n, 2 * dt)),
             "li": nir.LI(tau=np.full(n, 5e-3), r=np.ones(n), v_leak=np.zeros(n))}
    return _graph(nodes, [("input", "a"), ("a", "lif"), ("lif", "delay"), ("delay", "li"), ("li", "output")], [2])


def test_export_refuses_a_dt_other_than_the_layers_own(tmp_path: Path) -> None:
    """An import at dt = 1e-3 exported with to_nir's default dt = 1e-4 gave a graph that, imported with the dt it
    was exported with (as the docs say), ran another network. It is refused, naming the module; exported with the
    layers' dt it re-imports exactly."""
    model = from_nir(_graph_with_a_dt(1e-3), dt=1e-3, dtype=F64)
    x = torch.as_tensor(np.random.default_rng(3).uniform(0, 10, (30, 2, 2)))
    with pytest.raises(NIRError, match=r"module 'lif' \(Neuron\).*dt = 0\.001.*dt = 0\.0001"):
        to_nir(model, x[0])
    for module in (model.module("li"), model.module("delay")):
        with pytest.raises(NIRError, match="dt = 0.001"):
            to_nir(nn.Sequential(module), x[0, :, :1].expand(2, 3).contiguous())
    with torch.no_grad():
        expected = model(x)
    model.reset()
    nir.write(tmp_path / "g.nir", to_nir(model, x[0], dt=1e-3))
    again = from_nir(tmp_path / "g.nir", dt=1e-3, dtype=F64)
    with torch.no_grad():
        assert torch.equal(again(x), expected)
    assert expected.abs().sum() > 0


# -- what was checked and is right --------------------------------------------------------------------------------
def _fields(rng: np.random.Generator, shape, kind: str) -> dict[str, np.ndarray]:
    pos = lambda lo, hi: rng.uniform(lo, hi, shape)  # noqa: E731
    common = {"v_threshold": pos(0.5, 1.5), "v_reset": pos(-0.5, 0.3)}
    if kind == "LIF":
        return {"tau": pos(2e-4, 2e-3), "r": pos(0.5, 3), "v_leak": pos(-0.3, 0.3), **common}
    if kind == "IF":
        return {"r": pos(1e3, 5e3), **common}
    return {"tau_syn": pos(2e-4, 2e-3), "tau_mem": pos(2e-4, 2e-3), "r": pos(0.5, 3), "v_leak": pos(-0.3, 0.3),
            "w_in": pos(0.5, 2), **common}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind, method", [("LIF", "euler"), ("IF", "euler"), ("CubaLIF", "euler"),
                                          ("CubaLIF", "semi_implicit")])
def test_per_neuron_fields_on_a_multi_dimensional_neuron_shape(backend: str, kind: str, method: str) -> None:
    """Every field per neuron on a [2, 3, 4] neuron shape (r != 1, v_leak, v_reset != 0), and the same node with
    fields of broadcasting shapes ((2, 1, 1) per channel, scalars): NIR's equations exactly, 'm' and 's' alike."""
    rng = np.random.default_rng(4)
    shape = (2, 3, 4)
    fields = _fields(rng, shape, kind)
    x = rng.uniform(0, 3, (16, 3, *shape)) * (30 if kind == "CubaLIF" else 1)
    for narrowed in (False, True):
        node = getattr(nir, kind)(**fields)
        if narrowed:  # set after the constructor, which wants one shape for all fields
            node.v_threshold = np.asarray(fields["v_threshold"][:, :1, :1])
            node.v_reset = np.asarray(-0.2)
        graph = _chain(node, list(shape))
        expected = simulate(graph, x, DT, current_first=method == "semi_implicit")
        assert 0 < expected.mean() < 1
        for got in _both_modes(graph, x, backend, method=method):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_exact_cuba_lif_with_equal_and_unequal_time_constants(backend: str) -> None:
    n = 6
    tau_mem = np.array([1e-3, 2e-3, 1e-3, 5e-4, 3e-3, 1e-3])
    tau_syn = np.array([1e-3, 1e-3, 2e-3, 5e-4, 3e-3, 1e-3 * (1 + 1e-9)])
    node = nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau_mem, r=np.full(n, 2.0), v_leak=np.full(n, 0.1),
                       v_threshold=np.ones(n), v_reset=np.full(n, -0.1), w_in=np.full(n, 1.5))
    x = np.random.default_rng(5).uniform(0, 60, (30, 4, n))
    expected = _exact_cuba(x, node, DT)
    assert 0 < expected.mean() < 1
    for got in _both_modes(_chain(node, [n]), x, backend, method="exact"):
        np.testing.assert_array_equal(got, expected)


def _lif(rng: np.random.Generator, n: int) -> nir.LIF:
    return nir.LIF(**_fields(rng, (n,), "LIF"))


def _structures() -> dict[str, nir.NIRGraph]:
    rng = np.random.default_rng(6)
    n = 4
    lin = lambda rows, cols, scale=1.0: rng.normal(size=(rows, cols)) * scale  # noqa: E731
    diamond = _graph({"a": nir.Affine(lin(n, 3), rng.normal(size=n)), "b": nir.Linear(lin(n, 3)), "l1": _lif(rng, n),
                      "l2": _lif(rng, n), "c": nir.Linear(np.abs(lin(n, n, 2.0))), "l3": _lif(rng, n)},
                     [("input", "a"), ("input", "b"), ("a", "l1"), ("b", "l2"), ("l1", "c"), ("l2", "c"), ("c", "l3"),
                      ("l1", "l3"), ("l3", "output")], [3])
    diamond.nodes["output"] = nir.Output(np.array([n]))
    intermediate = _graph({"a": nir.Affine(lin(n, 3), np.zeros(n)), "l1": _lif(rng, n), "c": nir.Linear(lin(n, n)),
                           "l2": _lif(rng, n)},
                          [("input", "a"), ("a", "l1"), ("l1", "c"), ("c", "l2"), ("l1", "output")], [3])
    intermediate.nodes["output"] = nir.Output(np.array([n]))
    recurrent = _graph({"a": nir.Affine(lin(n, 3), rng.normal(size=n)), "l1": _lif(rng, n),
                        "w": nir.Linear(lin(n, n, 2.0)), "l2": _lif(rng, n)},
                       [("input", "a"), ("a", "l1"), ("l1", "w"), ("w", "l1"), ("l1", "l2"), ("l2", "l2"),
                        ("l2", "output")], [3])
    recurrent.nodes["output"] = nir.Output(np.array([n]))
    skip = _graph({"l": _lif(rng, 3)}, [("input", "l"), ("l", "output"), ("input", "output")], [3])
    return {"diamond": diamond, "intermediate output": intermediate, "recurrent with a self-loop": recurrent,
            "input summed into the output": skip}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", list(_structures()))
def test_branches_merges_recurrence_and_intermediate_outputs(backend: str, name: str) -> None:
    graph = _structures()[name]
    strong = name in ("diamond", "recurrent with a self-loop")
    x = np.random.default_rng(7).uniform(0, 2, (25, 3, 3)) * (20 if strong else 1)
    expected = simulate(graph, x, DT)
    assert expected.sum() > 0
    for got in _both_modes(graph, x, backend):
        np.testing.assert_array_equal(got, expected)


def test_a_node_feeding_an_output_and_a_second_output_from_the_input() -> None:
    rng = np.random.default_rng(8)
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([3])), "l": _lif(rng, 3), "o1": nir.Output(np.array([3])),
                                "o2": nir.Output(np.array([3]))},
                         edges=[("input", "l"), ("l", "o1"), ("input", "o2")], type_check=False)
    x = rng.uniform(0, 3, (10, 2, 3))
    with torch.no_grad():
        out = from_nir(graph, dt=DT, dtype=F64)(torch.as_tensor(x))
    assert isinstance(out, dict) and set(out) == {"o1", "o2"}
    assert torch.equal(out["o2"], torch.as_tensor(x))
    single = nir.NIRGraph(nodes={k: v for k, v in graph.nodes.items() if k != "o2"},
                          edges=[("input", "l"), ("l", "o1")], type_check=False)
    np.testing.assert_array_equal(out["o1"].numpy(), simulate(single, x, DT))


LAYERS = {
    "LIFNode": lambda: LIFNode(tau=3.0, v_reset=0.2, v_threshold=1.1),
    "LIFNode decay_input=False": lambda: LIFNode(tau=3.0, decay_input=False, v_reset=-0.2, v_threshold=0.7),
    "lif per-neuron": lambda: Neuron("lif", tau=torch.linspace(1.5, 4, 5, dtype=F64),
                                     v_threshold=torch.linspace(0.6, 1.4, 5, dtype=F64), v_reset=0.1),
    "ParametricLIFNode": lambda: ParametricLIFNode(init_tau=3.0, v_reset=0.1),
    "ParametricLIFNode decay_input=False": lambda: ParametricLIFNode(init_tau=3.0, decay_input=False),
    "IFNode": lambda: IFNode(v_reset=0.3, v_threshold=1.2),
    "SimpleIFNode": lambda: SimpleIFNode(),
    "SimpleLIFNode": lambda: SimpleLIFNode(tau=2.5, decay_input=False),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", list(LAYERS))
def test_every_exported_layer_imports_again_through_a_file(backend: str, name: str, tmp_path: Path) -> None:
    torch.manual_seed(9)
    layer = LAYERS[name]()
    model = nn.Sequential(nn.Linear(3, 5, dtype=F64), layer).to(F64)
    x = torch.rand(30, 4, 3, dtype=F64) * 8
    with torch.no_grad():
        expected = torch.stack([model(x_t) for x_t in x])
    layer.reset()
    nir.write(tmp_path / "m.nir", to_nir(model, x[0], dt=1e-3))
    got = from_nir(tmp_path / "m.nir", dt=1e-3, dtype=F64, backend=backend)(x)
    assert 0 < expected.mean() < 1
    assert torch.equal(got, expected)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("time_step, tau_syn", [(1.0, 4.0), (0.5, 4.0), (1.0, 3.0)])
def test_cuba_lif_exports_and_imports_exactly(backend: str, time_step: float, tau_syn: float,
                                             tmp_path: Path) -> None:
    torch.manual_seed(10)
    layer = Neuron("cuba_lif", tau=3.0, tau_syn=tau_syn, R=1.5, v_rest=0.1, v_reset=0.1, time_step=time_step)
    model = nn.Sequential(nn.Linear(3, 5, dtype=F64), layer).to(F64)
    x = torch.rand(30, 4, 3, dtype=F64) * 3
    with torch.no_grad():
        expected = torch.stack([model(x_t) for x_t in x])
    layer.reset()
    nir.write(tmp_path / "m.nir", to_nir(model, x[0], dt=1e-3))
    got = from_nir(tmp_path / "m.nir", dt=1e-3, dtype=F64, method="exact", backend=backend)(x)
    assert 0 < expected.mean() < 1
    assert torch.equal(got, expected)


def test_truncated_files_are_refused_with_a_nir_error(tmp_path: Path) -> None:
    graph = _chain(nir.CubaLIF(**_fields(np.random.default_rng(11), (4,), "CubaLIF")), [4])
    nir.write(tmp_path / "g.nir", graph)
    data = (tmp_path / "g.nir").read_bytes()
    cuts = list(range(0, len(data), max(1, len(data) // 12)))[:12] + [len(data) - 1]
    for cut in cuts:
        (tmp_path / "t.nir").write_bytes(data[:cut])
        with pytest.raises(NIRError):
            from_nir(tmp_path / "t.nir")


def test_a_tampered_field_in_a_file_is_refused_naming_node_and_field(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    graph = _chain(nir.LIF(**_fields(np.random.default_rng(12), (4,), "LIF")), [4])
    for value, message in ((np.full(4, np.nan), "finite"), (np.full(4, -1e-3), "positive"),
                           (np.full(4, np.inf), "finite")):
        nir.write(tmp_path / "g.nir", graph)
        with h5py.File(tmp_path / "g.nir", "r+") as file:
            file["node/nodes/n/tau"][...] = value
        with pytest.raises(NIRError, match=f"node 'n'.*'tau'.*{message}"):
            from_nir(tmp_path / "g.nir")


# -- wider sweeps ---------------------------------------------------------------------------------------------------
@pytest.mark.skipif(profile() != "slow", reason="a sweep of random per-neuron fields and shapes: in the slow profile")
@pytest.mark.parametrize("seed", range(12))
def test_random_fields_and_shapes_match_nir_equations(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(d) for d in rng.integers(1, 4, rng.integers(1, 4)))
    kind = ("LIF", "IF", "CubaLIF")[seed % 3]
    method = "semi_implicit" if kind == "CubaLIF" and seed % 2 else "euler"
    node = getattr(nir, kind)(**_fields(rng, shape, kind))
    graph = _chain(node, list(shape))
    x = rng.uniform(0, 3, (20, 2, *shape)) * (30 if kind == "CubaLIF" else 1)
    expected = simulate(graph, x, DT, current_first=method == "semi_implicit")
    for backend in ("reference", "host"):
        for got in _both_modes(graph, x, backend, method=method):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.skipif(profile() != "slow", reason="a sweep of time-constant ratios: in the slow profile")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_cuba_steps_stay_finite_over_time_constant_ratios(dtype: torch.dtype) -> None:
    ratios = 10.0 ** np.arange(-8, 9)
    n = len(ratios)
    tau_mem = np.full(n, 1e-3)
    node = nir.CubaLI(tau_syn=tau_mem * ratios, tau_mem=tau_mem, r=np.ones(n), v_leak=np.zeros(n), w_in=np.ones(n))
    got = _run(from_nir(_chain(node, [n]), dt=1e-3, dtype=dtype, method="exact"), np.ones((5, 1, n), np.float64)
               .astype(np.float32 if dtype == torch.float32 else np.float64))
    assert np.isfinite(got).all()
    spiking = nir.CubaLIF(tau_syn=node.tau_syn, tau_mem=tau_mem, r=np.ones(n), v_leak=np.zeros(n),
                          v_threshold=np.full(n, 1e9), v_reset=np.zeros(n), w_in=np.ones(n))
    for backend in ("reference", "host"):
        model = from_nir(_chain(spiking, [n]), dt=1e-3, dtype=dtype, method="exact", backend=backend)
        model.module("n").store_v_seq = True
        _run(model, np.ones((5, 1, n), np.float32 if dtype == torch.float32 else np.float64))
        v = model.module("n").v_seq.double().numpy()
        # float32: both go through the fixed point v* = v_leak + r w_in x (of order 1), so absolute errors of eps
        np.testing.assert_allclose(v, got, rtol=1e-4 if dtype == torch.float32 else 1e-12,
                                   atol=1e-6 if dtype == torch.float32 else 1e-15)
    assert not math.isnan(float(got.sum()))
