"""NIR import under adversarial and unusual graphs (issue 43): SumPool2d sums, imports never share the graph's
arrays, subgraph imports export again, node names never replace one another, and every value, size, depth and
delay past autocuda.nir.checks' limits is refused with a NIRError naming the node and field, before anything big
is allocated.
"""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")
h5py = pytest.importorskip("h5py")

from autocuda.base.errors import NIRError  # noqa: E402
from autocuda.tools.nir import checks, from_nir, to_nir  # noqa: E402
from autocuda.tools.nir.modules import SumPool2d  # noqa: E402

DT = 1e-4
F64 = torch.float64
SMALL = 64 * 2**20  # bytes: what a refusal may allocate at most through numpy (tracemalloc sees numpy's arrays)


def _chain(*nodes, names=None, shape=2, extra_nodes=None, extra_edges=()) -> nir.NIRGraph:
    names = names or [f"n{k}" for k in range(len(nodes))]
    table = {"input": nir.Input(np.array([shape])), **dict(zip(names, nodes)), **(extra_nodes or {}),
             "output": nir.Output(np.array([shape]))}
    order = ["input", *names, "output"]
    return nir.NIRGraph(nodes=table, edges=list(zip(order[:-1], order[1:])) + list(extra_edges), type_check=False)


def _lif(n: int = 2, **changes) -> nir.LIF:
    fields = {"tau": np.full(n, 2e-4), "r": np.ones(n), "v_leak": np.zeros(n), "v_threshold": np.ones(n),
              "v_reset": np.zeros(n), **changes}
    return nir.LIF(**fields)


def _with(node, **fields):
    """`node` with `fields` set after its constructor (whose checks a graph from elsewhere need not have passed)."""
    for field, value in fields.items():
        setattr(node, field, value)
    return node


def _run(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(x)).numpy()


# -- SumPool2d ---------------------------------------------------------------------------------------------------
def test_sum_pool_sums_each_window_exactly() -> None:
    assert SumPool2d((2, 2), (2, 2), (0, 0))(torch.ones(1, 1, 2, 2)).item() == 4.0
    x = np.arange(2 * 3 * 5 * 5, dtype=np.float64).reshape(2, 3, 5, 5)  # integers: sums are exact
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = np.array([[[[padded[b, c, i:i + 3, j:j + 3].sum() for j in range(0, 5, 2)] for i in range(0, 5, 2)]
                          for c in range(3)] for b in range(2)])
    got = SumPool2d((3, 3), (2, 2), (1, 1))(torch.as_tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)
    pool = nir.SumPool2d(kernel_size=np.array([3, 3]), stride=np.array([2, 2]), padding=np.array([1, 1]))
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([3, 5, 5])), "pool": pool,
                                "output": nir.Output(np.array([3, 3, 3]))},
                         edges=[("input", "pool"), ("pool", "output")], type_check=False)
    np.testing.assert_array_equal(_run(from_nir(graph, dtype=F64), x[None]), expected[None])


# -- imports copy --------------------------------------------------------------------------------------------------
def test_a_float64_import_shares_no_memory_with_the_graph() -> None:
    rng = np.random.default_rng(0)
    graph = _chain(nir.Affine(weight=rng.normal(size=(3, 2)), bias=rng.normal(size=3)),
                   _lif(3, tau=np.array([2e-4, 3e-4, 4e-4]), v_threshold=np.array([0.5, 0.6, 0.7])),
                   nir.Linear(weight=rng.normal(size=(3, 3))), nir.Scale(scale=np.array([1.0, 2.0, 3.0])),
                   nir.LI(tau=np.array([3e-4, 4e-4, 5e-4]), r=np.ones(3), v_leak=np.zeros(3)), shape=2)
    graph.nodes["output"] = nir.Output(np.array([3]))
    arrays = [value for node in graph.nodes.values() for value in vars(node).values() if isinstance(value, np.ndarray)
              and value.dtype == np.float64]
    before = [array.copy() for array in arrays]
    model = from_nir(graph, dtype=F64)
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [value for module in model.modules() for value in vars(module).values()
                if isinstance(value, torch.Tensor)]
    assert not [1 for t in tensors for a in arrays if np.shares_memory(t.detach().numpy(), a)]
    optimiser = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.rand(4, 2, 2, dtype=F64) * 5).sum().backward()
    optimiser.step()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    for array, saved in zip(arrays, before):
        np.testing.assert_array_equal(array, saved)
    again = from_nir(graph, dtype=F64)
    assert torch.equal(again.module("n0").weight, torch.as_tensor(before[0]))


# -- subgraphs export again ------------------------------------------------------------------------------------------
def _rleaky_subgraph(rng: np.random.Generator) -> nir.NIRGraph:
    """snnTorch's RLeaky as its exporter writes it: {input, lif, w_rec, output} with lif -> w_rec -> lif."""
    tau = 2e-4 / (1 - rng.uniform(0.5, 0.9, 4))
    lif = nir.LIF(tau=tau, r=tau / DT, v_leak=np.zeros(4), v_threshold=np.full(4, 0.7), v_reset=np.zeros(4))
    return nir.NIRGraph(nodes={"input": nir.Input(np.array([4])), "lif": lif,
                               "w_rec": nir.Linear(weight=rng.normal(size=(4, 4))),
                               "output": nir.Output(np.array([4]))},
                        edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")],
                        type_check=False)


def test_an_imported_graph_with_subgraphs_exports_and_imports_again(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    pre = nir.NIRGraph(nodes={"input": nir.Input(np.array([3])), "fc": nir.Affine(weight=rng.normal(size=(4, 3)),
                                                                                  bias=np.zeros(4)),
                              "output": nir.Output(np.array([4]))},
                       edges=[("input", "fc"), ("fc", "output")], type_check=False)
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([3])), "pre": pre, "sub": _rleaky_subgraph(rng),
                                "scale": nir.Scale(scale=np.full(4, 2.0)), "output": nir.Output(np.array([4]))},
                         edges=[("input", "pre"), ("pre", "sub"), ("sub", "scale"), ("scale", "output")],
                         type_check=False)
    x = rng.uniform(0, 2, size=(12, 2, 3))
    model = from_nir(graph, dtype=F64)
    expected = _run(model, x)
    model.reset()
    assert expected.sum() > 3
    exported = to_nir(model, torch.as_tensor(x[0]), dt=DT)
    assert not [name for name, node in exported.nodes.items() if isinstance(node, (nir.Input, nir.Output))
                and name not in ("input", "output")]
    nir.write(tmp_path / "sub.nir", exported)
    np.testing.assert_array_equal(_run(from_nir(tmp_path / "sub.nir", dtype=F64), x), expected)


# -- names ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("names", [("s.x", "s__x"), ("s__x", "s.x"), ("keys", "training"), ("a.b", "a__b_2")])
def test_node_names_with_one_module_key_keep_their_own_modules(names: tuple[str, str]) -> None:
    first, second = names
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), first: nir.Scale(scale=np.full(2, 2.0)),
                                second: nir.Scale(scale=np.full(2, 3.0)), "output": nir.Output(np.array([2]))},
                         edges=[("input", first), ("input", second), (first, "output"), (second, "output")],
                         type_check=False)
    if names == ("a.b", "a__b_2"):
        graph.nodes["a__b"] = nir.Scale(scale=np.full(2, 5.0))
        graph.edges += [("input", "a__b"), ("a__b", "output")]
    model = from_nir(graph, dtype=F64)
    assert len({model.keys[name] for name in model.names}) == len(model.names)
    assert model.module(first).scale[0] == 2.0 and model.module(second).scale[0] == 3.0
    total = 10.0 if names == ("a.b", "a__b_2") else 5.0
    np.testing.assert_array_equal(_run(model, np.ones((1, 1, 2))), np.full((1, 1, 2), total))


def test_a_top_level_name_that_an_inlined_node_would_take_is_refused_naming_both() -> None:
    inner = nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), "scale": nir.Scale(scale=np.full(2, 2.0)),
                                "output": nir.Output(np.array([2]))},
                         edges=[("input", "scale"), ("scale", "output")], type_check=False)
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), "sub.scale": nir.Scale(scale=np.full(2, 3.0)),
                                "sub": inner, "output": nir.Output(np.array([2]))},
                         edges=[("input", "sub.scale"), ("sub.scale", "sub"), ("sub", "output")], type_check=False)
    with pytest.raises(NIRError, match=r"node 'sub.scale' and node 'scale' of subgraph 'sub' would both be"):
        from_nir(graph)


# -- values --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("node, options, message", [
    (_lif(tau=np.array([2e-4, np.nan])), {}, r"node 'n0' \(LIF\): field 'tau': must be positive and finite"),
    (_lif(v_threshold=np.array([np.nan, 1.0])), {}, r"node 'n0' \(LIF\): field 'v_threshold': must be finite"),
    (_lif(tau=np.array([np.inf, 2e-4])), {}, r"node 'n0' \(LIF\): field 'tau': must be positive and finite.*inf"),
    (_lif(tau=np.array([2e-4, 0.0])), {}, r"field 'tau': must be positive"),
    (_lif(tau=np.array([2e-4, 1e-300])), {}, r"field 'tau': must be positive and finite in float32, got 1e-300"),
    (_lif(r=np.array([1.0, 1e300])), {}, r"field 'r': must be finite in float32, got 1e\+300 at index \(1,\)"),
    (nir.CubaLIF(tau_syn=np.full(2, -1e-3), tau_mem=np.full(2, 1e-3), r=np.ones(2), v_leak=np.zeros(2),
                 v_threshold=np.ones(2), v_reset=np.zeros(2), w_in=np.ones(2)), {}, r"CubaLIF\): field 'tau_syn'"),
    (nir.LI(tau=np.full(2, np.nan), r=np.ones(2), v_leak=np.zeros(2)), {}, r"\(LI\): field 'tau'"),
    (nir.Affine(weight=np.array([[1.0, np.nan], [0.0, 1.0]]), bias=np.zeros(2)), {}, r"field 'weight'.*index \(0, 1\)"),
    (nir.Scale(scale=np.array(["a", "b"])), {}, r"\(Scale\): field 'scale': expected real numbers"),
    (_lif(), {"dt": float("inf")}, "dt: the time step must be positive and finite"),
    (_lif(), {"dt": float("nan")}, "dt: the time step must be positive and finite"),
    (_lif(), {"dt": "soon"}, "dt: the time step must be a number"),
    (_lif(), {"dt": "1e-4"}, "dt: the time step must be a number of seconds, got str '1e-4'"),  # float(dt) took it
    (_lif(), {"dt": True}, "dt: the time step must be a number of seconds, got bool"),  # as 1 s
    (nir.Delay(delay=np.array([])), {}, r"node 'n0' \(Delay\): field 'delay': empty"),  # torch's max() at run time
    (_with(_lif(), v_threshold=np.ones(3)), {}, r"node 'n0' \(LIF\): the shapes of its fields \(tau \(2,\), "
     r"r \(2,\), v_leak \(2,\), v_threshold \(3,\), v_reset \(2,\)\) do not broadcast together"),
    (nir.Delay(delay=np.array([1e5, 0.0])), {}, r"node 'n0' \(Delay\): field 'delay': the longest delay is 1e\+09 "
                                               r"steps.*MAX_DELAY_VALUES"),
    (nir.Delay(delay=np.array([-DT, 0.0])), {}, r"field 'delay': delays must be non-negative"),
    (nir.SumPool2d(kernel_size=np.array([2, 0]), stride=np.array([1, 1]), padding=np.array([0, 0])), {},
     r"\(SumPool2d\): field 'kernel_size': expected whole numbers from 1"),
    (nir.AvgPool2d(kernel_size=np.array([2, 2]), stride=np.array([1.5, 1]), padding=np.array([0, 0])), {},
     r"field 'stride': expected whole numbers"),
])
def test_bad_values_are_refused_naming_node_and_field(node, options, message) -> None:
    with pytest.raises(NIRError, match=message):
        from_nir(_chain(node), **options)


def test_edges_to_missing_nodes_and_into_inputs_are_refused() -> None:
    with pytest.raises(NIRError, match=r"edge \('n0', 'ghost'\) names node 'ghost'"):
        from_nir(_chain(nir.Scale(scale=np.ones(2)), extra_edges=[("n0", "ghost")]))
    with pytest.raises(NIRError, match=r"ends at Input node 'input'"):
        from_nir(_chain(nir.Scale(scale=np.ones(2)), extra_edges=[("n0", "input")]))
    with pytest.raises(NIRError, match=r"node names must be non-empty strings"):
        from_nir(_chain(nir.Scale(scale=np.ones(2)), extra_nodes={3: nir.Scale(scale=np.ones(2))}))


def test_a_node_that_fails_on_its_input_is_named() -> None:
    model = from_nir(_chain(nir.Affine(weight=np.ones((3, 5)), bias=np.zeros(3)), shape=4))
    with pytest.raises(NIRError, match=r"node 'n0' \(Linear\) fails on its input \(shapes \[\(3, 2, 4\)\]\)"):
        model(torch.ones(3, 2, 4))


def test_edges_of_different_shapes_into_one_node_are_refused_not_broadcast() -> None:
    """Found by the fuzz: a node's input is the sum of its edges, which torch would broadcast ([B, 1] + [B, 3])."""
    graph = _chain(nir.Affine(weight=np.ones((1, 3)), bias=np.zeros(1)), shape=3, extra_edges=[("input", "output")])
    with pytest.raises(NIRError, match=r"node 'output' gets inputs of shapes \[\(3, 2, 1\), \(3, 2, 3\)\]"):
        from_nir(graph, dtype=F64)(torch.ones(3, 2, 3, dtype=F64))
    recurrent = _chain(nir.Affine(weight=np.ones((1, 2)), bias=np.zeros(1)), _lif(1), shape=2,
                       extra_nodes={"w": nir.Linear(weight=np.ones((2, 1)))}, extra_edges=[("n1", "w"), ("w", "n1")])
    recurrent.nodes["output"] = nir.Output(np.array([1]))
    with pytest.raises(NIRError, match=r"node 'n1' gets inputs of shapes \[\(2, 1\), \(2, 2\)\]"):
        from_nir(recurrent, dtype=F64)(torch.ones(3, 2, 2, dtype=F64))


@pytest.mark.parametrize("node, field", [
    (_with(_lif(4), v_threshold=np.array([[1.0] * 4, [9.0] * 4])), "v_threshold"),
    (nir.Delay(delay=np.array([[0.0] * 4, [3 * DT] * 4])), "delay"),
    (nir.I(r=np.array([[1.0] * 4, [100.0] * 4])), "r"),
    (nir.Scale(scale=np.array([[1.0] * 4, [2.0] * 4])), "scale"),
    (_lif(3, v_threshold=np.full(3, 0.5)), "tau"),  # every field one value: their shape (3,) still counts
])
def test_a_field_larger_than_the_neurons_is_refused_not_broadcast_over_the_batch(node, field: str) -> None:
    """A field of shape (2, 4) on an input [T, 2, 4] was broadcast over the batch (a threshold per sample), one of
    (3,) whose values are equal taken as one value for all 4 neurons; now refused at the first call."""
    for step_mode, x in (("m", torch.full((3, 2, 4), 2.0, dtype=F64)), ("s", torch.full((2, 4), 2.0, dtype=F64))):
        model = from_nir(_chain(node, shape=4), dtype=F64, step_mode=step_mode)
        with pytest.raises(NIRError, match=rf"node 'n0': field '{field}' has shape \({node.__dict__[field].shape[0]},"
                                           r".*does not fit the neuron shape \(4,\) of its input"):
            model(x)
    wide = from_nir(_chain(node, shape=4), dtype=F64)  # the same field on neurons of its own shape runs
    shape = tuple(node.__dict__[field].shape)
    assert wide(torch.full((3, 1, *shape), 2.0, dtype=F64)).shape == (3, 1, *shape)


def _li(n: int = 3) -> nir.LI:
    return nir.LI(tau=np.full(n, 2e-4), r=np.ones(n), v_leak=np.full(n, 0.25))


def _cuba_li(n: int = 3) -> nir.CubaLI:
    return nir.CubaLI(tau_syn=np.full(n, 3e-4), tau_mem=np.full(n, 2e-4), r=np.ones(n), v_leak=np.full(n, 0.25),
                      w_in=np.ones(n))


def _recurrent(n: int = 3) -> nir.NIRGraph:
    return _chain(_lif(n, tau=np.full(n, 3e-4)), shape=n, extra_nodes={"w": nir.Linear(weight=np.eye(n) * 0.3)},
                  extra_edges=[("n0", "w"), ("w", "n0")])


@pytest.mark.parametrize("graph", [_chain(_li()), _chain(_cuba_li(), shape=3), _chain(nir.Delay(np.full(3, 2 * DT)),
                                                                                        shape=3), _recurrent()])
def test_an_empty_sequence_gives_empty_outputs_and_keeps_the_states(graph: nir.NIRGraph) -> None:
    """T = 0 runs no step, as our layers do (docs/bad-input.md). Found: torch's 'stack expects a non-empty
    TensorList' (a NIRError from LI, CubaLI and Delay, a bare RuntimeError from a recurrent graph)."""
    model = from_nir(graph, dtype=F64)
    x = torch.rand(6, 2, 3, dtype=F64) * 3
    expected = model(x)
    model.reset()
    first = model(x[:3])
    assert model(torch.zeros(0, 2, 3, dtype=F64)).shape == (0, 2, 3)
    assert torch.equal(torch.cat([first, model(x[3:])]), expected)
    model.reset()
    assert model(torch.zeros(0, 2, 3, dtype=F64)).shape == (0, 2, 3)
    assert torch.equal(model(x), expected)


@pytest.mark.parametrize("node", [_li(), nir.I(r=np.full(3, 1e3)), _cuba_li(), nir.Delay(np.full(3, 2 * DT))])
def test_torch_op_nodes_restart_when_the_batch_size_changes(node) -> None:
    """As our layers (docs/bad-input.md): a kept state of another batch size restarts at its initial value. Found:
    a batch of 1 was broadcast over the next batch of 2, and a batch of 3 then 2 raised."""
    model = from_nir(_chain(node, shape=3), dtype=F64)
    x = torch.rand(4, 2, 3, dtype=F64) + 1
    expected = model(x)
    for batch in (1, 3):
        model.reset()
        model(torch.full((4, batch, 3), 5.0, dtype=F64))
        assert torch.equal(model(x), expected)
    model.reset()
    model.step_mode = "s"
    model(torch.full((1, 3), 5.0, dtype=F64))
    assert torch.equal(model(x[0]), expected[0])


# -- sizes, lengths, depths ---------------------------------------------------------------------------------------
def test_a_chain_of_3000_nodes_imports_and_runs() -> None:
    graph = _chain(*(nir.Scale(scale=np.full(2, 1.001)) for _ in range(3000)))
    model = from_nir(graph, dtype=F64)
    np.testing.assert_allclose(_run(model, np.ones((1, 1, 2))), np.full((1, 1, 2), 1.001 ** 3000), rtol=1e-12)


def test_a_bad_field_in_the_last_node_is_refused_before_any_neuron_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node's fields are checked before the first Neuron (milliseconds each) is built: a graph of
    thousands of neurons with NaN in its last is refused at the cost of the checks alone."""
    from autocuda.tools.nir import importer

    built = []
    monkeypatch.setattr(importer, "Neuron", lambda *args, **kwargs: built.append(1))
    neurons = [_lif() for _ in range(2000)] + [_lif(v_threshold=np.array([1.0, np.nan]))]
    with pytest.raises(NIRError, match=r"node 'n2000' \(LIF\): field 'v_threshold': must be finite"):
        from_nir(_chain(*neurons))
    assert not built


def test_more_nodes_than_the_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "MAX_NODES", 50)
    with pytest.raises(NIRError, match=r"graph: more than 50 nodes \(at node 'n49'\).*MAX_NODES"):
        from_nir(_chain(*(nir.Scale(scale=np.ones(2)) for _ in range(60))))


def _nested(depth: int) -> nir.NIRGraph:
    graph = _chain(nir.Scale(scale=np.ones(2)))
    for _ in range(depth):
        graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), "g": graph, "output": nir.Output(np.array([2]))},
                             edges=[("input", "g"), ("g", "output")], type_check=False)
    return graph


def test_nesting_past_the_limit_is_refused_and_within_it_imports() -> None:
    np.testing.assert_array_equal(_run(from_nir(_nested(checks.MAX_DEPTH), dtype=F64), np.ones((1, 1, 2))),
                                  np.ones((1, 1, 2)))
    with pytest.raises(NIRError, match=rf"subgraph '(g\.)+g': nested more than {checks.MAX_DEPTH} deep"):
        from_nir(_nested(3000))


def _huge_file(tmp_path: Path, field: str = "tau", elements: int = 10**9) -> Path:
    """A NIR file of a few KB whose LIF declares `field` of `elements` values (chunked, compressed, never written)."""
    path = tmp_path / "huge.nir"
    nir.write(path, _chain(_lif()))
    with h5py.File(path, "r+") as file:
        group = file["node/nodes/n0"]
        del group[field]
        group.create_dataset(field, shape=(elements,), dtype="f8", chunks=(2**20,), compression="gzip",
                             fillvalue=2e-4)
    assert path.stat().st_size < 100_000
    return path


def _refused_within(limit: int, call, match: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(NIRError, match=match):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_a_small_file_declaring_a_huge_field_is_refused_before_reading_it(tmp_path: Path) -> None:
    path = _huge_file(tmp_path)
    _refused_within(SMALL, lambda: from_nir(path), r"node 'n0' \(LIF\): field 'tau': 1000000000 values, more "
                                                   r"than the \d+ a field may hold")


def test_a_huge_broadcast_array_in_memory_is_refused_before_conversion() -> None:
    def huge(value: float) -> np.ndarray:  # 10**9 values in 4 bytes of memory
        return np.broadcast_to(np.float32(value), (10**9,))

    lif = nir.LIF(tau=huge(2e-4), r=huge(1.0), v_leak=huge(0.0), v_threshold=huge(1.0), v_reset=huge(0.0))
    _refused_within(SMALL, lambda: from_nir(_chain(lif)), r"node 'n0' \(LIF\): field 'tau': 1000000000")


def test_fields_past_the_graph_total_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "MAX_GRAPH_ELEMENTS", 15)
    with pytest.raises(NIRError, match=r"node 'n1' \(LIF\): field 'v_leak': the graph's fields hold more than 15"):
        from_nir(_chain(_lif(), _lif()))


def test_a_file_that_is_no_nir_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NIRError, match=r"a directory, not a NIR file"):  # it said "No such file"
        from_nir(tmp_path)
    (tmp_path / "text.nir").write_text("not hdf5")
    with pytest.raises(NIRError, match="Unable to read it as a NIR"):
        from_nir(tmp_path / "text.nir")
    with h5py.File(tmp_path / "empty.nir", "w"):
        pass
    with pytest.raises(NIRError, match="no group 'node'"):
        from_nir(tmp_path / "empty.nir")
    path = tmp_path / "bad.nir"
    nir.write(path, _chain(_lif()))
    with h5py.File(path, "r+") as file:
        del file["node/nodes/n0/tau"]
    with pytest.raises(NIRError, match=r"node 'n0' \(LIF\): the nir package refuses its fields"):
        from_nir(path)


def test_a_file_node_of_an_unknown_type_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "odd.nir"
    nir.write(path, _chain(_lif()))
    for kind in ("Mystery", "NIRNode", "read", "__class__"):
        with h5py.File(path, "r+") as file:
            del file["node/nodes/n0/type"]
            file["node/nodes/n0"].create_dataset("type", data=kind, dtype=h5py.string_dtype())
        with pytest.raises(NIRError, match=rf"node 'n0' has NIR type '{kind}', which the nir package does not know"):
            from_nir(path)


def test_links_in_a_file_are_refused_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "linked.nir"
    nir.write(path, _chain(_lif()))
    with h5py.File(path, "r+") as file:
        del file["node/nodes/n0/tau"]
        file["node/nodes/n0/tau"] = h5py.ExternalLink(str(tmp_path / "elsewhere.h5"), "/tau")
    with pytest.raises(NIRError, match=r"node 'n0': 'tau' is a link"):
        from_nir(path)
    with h5py.File(path, "r+") as file:
        del file["node/nodes/n0/tau"]
        file["node/nodes/n0/tau"] = h5py.SoftLink("/node/nodes/n0/r")
    with pytest.raises(NIRError, match=r"node 'n0': 'tau' is a link"):
        from_nir(path)
