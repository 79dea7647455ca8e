"""A fuzz of NIR graphs: random shapes, values (NaN, infinities, huge, tiny, negative), names (dots, double
underscores, empty, ModuleDict's attributes), structures (subgraphs, cycles, self-loops, dangling edges, edges
into inputs, unknown node types) and import options. Each case is imported and run, or refused with an
autocuda error (NIRError) that names a node, field, edge or argument: never another exception type, a hang, or a
big allocation. Some cases go through a file (nir.write, then from_nir(path)), some of those tampered with (a
field declared with 10**9 values, of another dtype, a group in its place, a field or type removed, an unknown
type, edges that are no pairs of names, a link back to the top).

A seeded generator (not hypothesis: a graph is built from many dependent draws, and the cases need no
shrinking to be read): cases are reproducible by their index. 10,000 cases under the slow profile, 150 by default;
AUTOCUDA_NIR_FUZZ_EXAMPLES sets the count.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import examples

nir = pytest.importorskip("nir")

from autocuda.base.errors import AutocudaError, NIRError  # noqa: E402
from autocuda.tools.nir import from_nir  # noqa: E402

CASES = int(os.environ.get("AUTOCUDA_NIR_FUZZ_EXAMPLES", examples(10_000, 150)))
NAMES = ["a", "b", "c", "a.b", "a__b", "a_b", "", "keys", "update", "training", "input", "output", "x.y.z",
         "x__y__z", "ü", "1", "a b", "sub", "sub.a", "n0", "forward"]
BAD_VALUES = [np.nan, np.inf, -np.inf, 0.0, -1.0, 1e300, -1e300, 1e-300, 1e38, 5e-324]
VECTOR_KINDS = ["LIF", "IF", "CubaLIF", "LI", "I", "CubaLI", "Affine", "Linear", "Scale", "Threshold", "Delay",
                "Subgraph", "Mystery"]
IMAGE_KINDS = ["Conv2d", "SumPool2d", "AvgPool2d", "Scale"]
NEURON_FIELDS = {"LIF": ("tau", "r", "v_leak", "v_threshold", "v_reset"), "IF": ("r", "v_threshold", "v_reset"),
                 "CubaLIF": ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"),
                 "LI": ("tau", "r", "v_leak"), "I": ("r",), "CubaLI": ("tau_syn", "tau_mem", "r", "v_leak", "w_in")}


@dataclasses.dataclass(eq=False)
class Mystery(nir.NIRNode):
    gain: np.ndarray

    def __post_init__(self) -> None:
        self.input_type = {"input": np.array(np.shape(self.gain))}
        self.output_type = {"output": np.array(np.shape(self.gain))}


class Case:
    """The draws of one case: `bad` is the chance that a value, shape or name is wrong."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.bad = float(self.rng.choice([0.0, 0.02, 0.1, 0.3]))
        self.huge = False  # a field of 10**9 values (a broadcast view: no memory) is in the graph

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options: list[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def values(self, shape: tuple[int, ...], field: str) -> Any:
        if self.chance(self.bad / 4):
            self.huge = True
            return np.broadcast_to(np.float32(1e-3), (10**9,))
        if self.chance(self.bad / 4):  # a wrong shape, or something that is no array of numbers
            return self.pick([np.zeros((3, 5)), np.zeros(0), "tau", None, np.array([[1.0], [2.0, 3.0]], dtype=object),
                              [[1.0], [2.0, 3.0]], np.array([1 + 2j]), np.array(["x", "y"])])
        if field.startswith("tau"):
            array = self.rng.uniform(1e-4, 1e-3, shape)
        elif field in ("v_threshold", "threshold"):
            array = self.rng.uniform(0.1, 1.0, shape)
        elif field == "delay":
            array = self.rng.integers(0, 3, shape) * 1e-4
        elif field == "r":
            array = self.rng.uniform(0.5, 2.0, shape) * (1e4 if self.chance(0.5) else 1.0)
        else:
            array = self.rng.normal(size=shape)
        if array.size and self.chance(self.bad):
            array.flat[self.rng.integers(array.size)] = self.pick(BAD_VALUES)
        return array

    def name(self, taken: set[str]) -> str:
        if self.chance(self.bad):
            return str(self.pick(NAMES))
        name = f"{self.pick(NAMES)}{len(taken)}"
        return name if name not in taken else f"n{len(taken)}"

    def width(self, width: int) -> int:
        return int(self.rng.integers(1, 5)) if self.chance(self.bad) else width


def _set(node: Any, **fields: Any) -> Any:
    """`node` (built from sound values, as the nir package's constructors check some) with fuzzed fields: what a
    program may hand over after changing a node."""
    for name, value in fields.items():
        setattr(node, name, value)
    return node


def _vector_node(case: Case, kind: str, width: int, depth: int) -> tuple[Any, int]:
    """A node of `kind` on vectors of `width`, and its output width."""
    rng = case.rng
    if kind in NEURON_FIELDS:
        fields = NEURON_FIELDS[kind]
        node = getattr(nir, kind)(**{f: np.ones(width) for f in fields})
        return _set(node, **{f: case.values((case.width(width),), f) for f in fields}), width
    if kind in ("Affine", "Linear"):
        out = int(rng.integers(1, 5))
        weight = case.values((out, case.width(width)), "weight")
        if kind == "Linear":
            return _set(nir.Linear(weight=np.ones((out, width))), weight=weight), out
        node = nir.Affine(weight=np.ones((out, width)), bias=np.ones(out))
        return _set(node, weight=weight, bias=case.values((case.width(out),), "bias")), out
    if kind in ("Scale", "Threshold", "Delay"):
        field = kind.lower()
        node = getattr(nir, kind)(np.ones(width))
        return _set(node, **{field: case.values((case.width(width),), field)}), width
    if kind == "Mystery":
        return Mystery(np.ones(width)), width
    if depth > 2:
        return nir.Scale(scale=np.ones(width)), width
    inner, out = _chain(case, width, int(rng.integers(1, 4)), VECTOR_KINDS, depth + 1)
    if case.chance(case.bad):  # a subgraph with a second input, or none
        inner.nodes["input2" if case.chance(0.5) else next(iter(inner.inputs), "input")] = nir.Input(np.array([width]))
    return inner, out


def _image_node(case: Case, kind: str, shape: tuple[int, int, int]) -> tuple[Any, tuple[int, int, int]]:
    rng = case.rng
    channels, height, width = shape
    if kind == "Conv2d":
        out, k, stride = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        pad = int(rng.integers(0, 2))
        node = nir.Conv2d(input_shape=(height, width), weight=np.ones((out, channels, k, k)), stride=stride,
                          padding=pad, dilation=1, groups=1, bias=np.ones(out))
        _set(node, weight=case.values((out, case.width(channels), k, k), "weight"), bias=case.values((out,), "bias"))
        if case.chance(case.bad):
            _set(node, **case.pick([{"padding": case.pick(["same", "valid", "full", -1, 2.5])}, {"dilation": 0},
                                    {"groups": case.pick([0, 2, 7, np.nan])}, {"stride": (1, 2, 3)}]))
        height, width = ((n + 2 * pad - k) // stride + 1 for n in (height, width))
        return node, (out, max(1, height), max(1, width))
    if kind in ("SumPool2d", "AvgPool2d"):
        k = int(rng.integers(1, 3))
        node = getattr(nir, kind)(kernel_size=np.array([k, k]), stride=np.array([k, k]), padding=np.array([0, 0]))
        if case.chance(case.bad):
            _set(node, **case.pick([{"kernel_size": np.array([k, 0])}, {"padding": np.array([5, 5])},
                                    {"stride": np.array([1e10, 1])}, {"kernel_size": np.array([[1, 2], [3, 4]])}]))
        return node, (channels, max(1, height // k), max(1, width // k))
    node = nir.Scale(scale=np.ones((channels, 1, 1)))
    return _set(node, scale=case.values((channels, 1, 1), "scale")), shape


def _chain(case: Case, width: int, length: int, kinds: list[str], depth: int = 0) -> tuple[nir.NIRGraph, int]:
    """input -> `length` random nodes -> output, with random extra edges where the case is bad."""
    names, nodes, taken = ["input"], {"input": nir.Input(np.array([width]))}, {"input", "output"}
    for _ in range(length):
        node, width = _vector_node(case, case.pick(kinds), width, depth)
        name = case.name(taken)
        taken.add(name)
        names.append(name)
        nodes[name] = node
    names.append("output")
    nodes["output"] = nir.Output(np.array([width]))
    return nir.NIRGraph(nodes=nodes, edges=list(zip(names[:-1], names[1:])) + _extra_edges(case, names),
                        type_check=False), width


def _extra_edges(case: Case, names: list[str]) -> list[tuple[str, str]]:
    edges = []
    while case.chance(case.bad * 2):  # cycles, self-loops, edges into inputs, to missing nodes
        source, target = (case.pick(names + ["ghost"]) for _ in range(2))
        edges.append((source, target))
    return edges


def _case(seed: int) -> tuple[Case, nir.NIRGraph, tuple[int, ...], dict[str, Any]]:
    case = Case(seed)
    rng = case.rng
    if case.chance(0.2):  # images first: [C, H, W] -> convolutions and pools -> flatten -> vectors
        shape = (int(rng.integers(1, 3)), int(rng.integers(2, 7)), int(rng.integers(2, 7)))
        nodes, names, current = {"input": nir.Input(np.array(shape))}, ["input"], shape
        for k in range(int(rng.integers(1, 4))):
            node, current = _image_node(case, case.pick(IMAGE_KINDS), current)
            nodes[f"i{k}"] = node
            names.append(f"i{k}")
        nodes["flat"] = nir.Flatten(input_type={"input": np.array(current)}, start_dim=0, end_dim=-1)
        if case.chance(case.bad):
            nodes["flat"].start_dim = case.pick([7, -9, 2.5, np.nan, "x"])
        rest, width = _chain(case, int(np.prod(current)), int(rng.integers(0, 4)), VECTOR_KINDS)
        rest_names = [n for n in rest.nodes if n not in ("input", "output")]
        nodes.update({n: rest.nodes[n] for n in rest_names})
        nodes["output"] = nir.Output(np.array([width]))
        order = names + ["flat", *rest_names, "output"]
        graph = nir.NIRGraph(nodes=nodes, edges=list(zip(order[:-1], order[1:])) + _extra_edges(case, order),
                             type_check=False)
        input_shape: tuple[int, ...] = shape
    else:
        width = int(rng.integers(1, 5))
        graph, _ = _chain(case, width, int(rng.integers(1, 7)), VECTOR_KINDS)
        input_shape = (width,)
    options: dict[str, Any] = {"dtype": case.pick([torch.float32, torch.float64]),
                               "method": case.pick(["euler", "semi_implicit", "exact"])}
    if case.chance(case.bad):
        options["dt"] = case.pick([0.0, -1e-4, np.nan, np.inf, 1e-300, 1e300, 3e-4, "soon"])
    return case, graph, input_shape, options


def _tamper(case: Case, path: Path) -> None:
    """One change to the file that nir.write would never make: a field declared with 10**9 values (stored
    compressed, never written), of another dtype, a group in a value's place, a field or the type removed, an
    unknown type, edges that are no pairs of names, or a link back to the top."""
    import h5py

    with h5py.File(path, "r+") as file:
        groups: list[Any] = []
        file["node"].visit(lambda key: groups.append(file["node"][key]) if key.count("/") == 1
                           and key.startswith("nodes/") else None)
        if not groups:
            return
        group = case.pick(groups)
        fields = [key for key in group if key != "metadata"]
        field = case.pick(fields) if fields else "type"
        change = case.pick(["huge", "dtype", "group", "delete", "type", "edges", "link"])
        field = "type" if change == "type" else field
        if field in group and change != "edges":
            del group[field]
        if change == "huge":
            group.create_dataset(field, shape=(10**9,), dtype="f8", chunks=(2**20,), compression="gzip")
        elif change == "dtype":
            group.create_dataset(field, data=case.pick([np.array([1 + 2j]), np.array([b"xx"]), np.zeros((2, 2), "i1")]))
        elif change == "group":
            group.create_group(field)
        elif change == "link":  # to the top: a cycle, were links followed
            group[field] = h5py.SoftLink("/node")
        elif change == "type":
            group.create_dataset("type", data=case.pick(["Mystery", "NIRNode", "__class__", "read"]),
                                 dtype=h5py.string_dtype())
        elif change == "edges":
            del file["node/edges"]
            file["node"].create_dataset("edges", data=case.pick([np.zeros((2, 3)), np.array([b"a", b"b", b"c"])]))


def _run_case(seed: int, folder: Path) -> str:
    """'ran', or the type of the refusal; raises what is neither."""
    case, graph, input_shape, options = _case(seed)
    source: Any = graph
    if not case.huge and case.chance(0.1):
        try:
            nir.write(folder / f"{seed}.nir", graph)
            source = folder / f"{seed}.nir"
        except Exception:  # the nir package cannot write every odd graph: the case runs in memory
            pass
        else:
            if case.chance(case.bad * 2):
                _tamper(case, source)
    try:
        model = from_nir(source, **options)
        x = torch.as_tensor(case.rng.uniform(-2, 2, (3, 2, *input_shape)), dtype=options["dtype"])
        with torch.no_grad():
            model(x)
    except NIRError as error:
        assert any(word in str(error) for word in ("node", "field", "edge", "graph", "subgraph", "dt:", "method:",
                                                   str(source))), error
        return "NIRError"
    except AutocudaError as error:
        return type(error).__name__
    return "ran"


@pytest.mark.parametrize("part", range(2))
def test_fuzzed_graphs_import_and_run_or_are_refused_in_bounded_time_and_memory(part: int, tmp_path: Path) -> None:
    """Each case in well under 5 s of this thread's CPU time (CPU time: the machine's load does not count), and
    the process's peak memory grows less than 1 GiB over all of them."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes: collections.Counter[str] = collections.Counter()
    slowest = (0.0, -1)
    for seed in range(part, CASES, 2):
        start = time.thread_time()
        try:
            outcomes[_run_case(seed, tmp_path)] += 1
        except Exception as error:
            raise AssertionError(f"fuzz case {seed}: {type(error).__name__}: {error}") from error
        slowest = max(slowest, (time.thread_time() - start, seed))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
    assert outcomes["ran"] and outcomes["NIRError"], outcomes
    assert slowest[0] < 5.0, f"case {slowest[1]} took {slowest[0]:.1f} s of CPU time"
    assert grown < 2**30, f"the peak memory grew by {grown / 2**20:.0f} MiB"
