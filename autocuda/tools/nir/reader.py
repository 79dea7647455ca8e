"""Reading a NIR file (HDF5, as `nir.write` writes it) under the limits of autocuda.nir.checks.

`nir.read` reads every dataset whole before anything can look at it, type-checks nested graphs and recurses once
per level of nesting; this reader checks each dataset's size from its header before reading it, counts nodes and
values against the limits, skips metadata (which autocuda does not use), and builds the nodes with the `nir`
package's own constructors (nested graphs unchecked, as `from_nir` checks them). What it refuses is a NIRError
naming the node and field.
"""
from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...base.errors import NIRError
from . import checks

if TYPE_CHECKING:
    import h5py  # type: ignore[import-untyped]
    import nir

__all__ = ["read"]


def read(path: str | Path) -> nir.NIRGraph:
    """The graph in the NIR file `path`."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
    if not path.is_file():
        raise NIRError(f"{path}: {'a directory' if path.is_dir() else 'not a regular file'}, not a NIR file")
    try:
        file = h5py.File(path, "r")
    except OSError as error:
        raise NIRError(f"{path}: Unable to read it as a NIR (HDF5) file: {error}") from None
    with file:
        top = file.get("node")
        if not isinstance(top, h5py.Group):
            raise NIRError(f"{path}: no group 'node': not a NIR file")
        try:
            graph = _node(top, "<graph>", checks.Budget(), depth=0)
        except NIRError:
            raise
        except (OSError, KeyError, RuntimeError, ValueError, TypeError) as error:  # h5py on a damaged file
            raise NIRError(f"{path}: Unable to read it as a NIR file: {type(error).__name__}: {error}") from None
    if type(graph).__name__ != "NIRGraph":
        raise NIRError(f"{path}: the top node is a {type(graph).__name__}, not a NIRGraph")
    return graph


def _node(group: h5py.Group, name: str, budget: checks.Budget, depth: int) -> nir.NIRNode:
    import h5py
    import nir

    kind = _string(group.get("type"), f"node {name!r}: field 'type'")
    if kind == "NIRGraph":
        return _graph(group, name, budget, depth)
    node_class: Any = getattr(nir, kind, None) if kind.isidentifier() and kind[:1].isupper() else None
    if not (isinstance(node_class, type) and issubclass(node_class, nir.NIRNode)) or kind == "NIRNode":
        raise NIRError(f"node {name!r} has NIR type {kind!r}, which the nir package does not know")
    fields: dict[str, Any] = {"type": kind}
    for key, item in _members(group, name):
        if key in ("type", "metadata"):
            continue
        if not isinstance(item, h5py.Dataset):
            raise NIRError(f"node {name!r} ({kind}): field {key!r} is a group, not a value")
        fields[key] = _dataset(item, f"node {name!r} ({kind}): field {key!r}", budget)
    try:
        return cast(Any, node_class).from_dict(fields)
    except Exception as error:  # the nir package's constructors on untrusted fields: any error is a refusal
        raise NIRError(f"node {name!r} ({kind}): the nir package refuses its fields: "
                       f"{type(error).__name__}: {error}") from None


def _graph(group: h5py.Group, name: str, budget: checks.Budget, depth: int) -> nir.NIRGraph:
    import h5py
    import nir

    if depth > checks.MAX_DEPTH:
        raise NIRError(f"subgraph {name!r}: nested more than {checks.MAX_DEPTH} deep "
                       "(autocuda.tools.nir.checks.MAX_DEPTH)")
    members = group.get("nodes")
    if not isinstance(members, h5py.Group):
        raise NIRError(f"graph {name!r}: no group 'nodes'")
    nodes = {}
    for key, item in _members(members, name):
        budget.node(key)
        inner = key if depth == 0 else f"{name}.{key}"
        if not isinstance(item, h5py.Group):
            raise NIRError(f"node {inner!r}: a value, not a node")
        nodes[key] = _node(item, inner, budget, depth + 1)
    edges = _dataset(group.get("edges"), f"graph {name!r}: field 'edges'", budget, strings=True)
    if edges.size == 0:
        edges = edges.reshape(0, 2)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise NIRError(f"graph {name!r}: field 'edges' must be pairs of node names, got shape {edges.shape}")
    budget.edge_count(name, len(edges))
    return nir.NIRGraph(nodes=nodes, edges=[(_text(a), _text(b)) for a, b in edges], type_check=False)


def _members(group: h5py.Group, name: str) -> list[tuple[str, Any]]:
    """The group's members, each a value or group of this file: links to elsewhere (other files, other paths of
    this one) are refused, not followed."""
    import h5py

    members = []
    for key in group:
        if not isinstance(group.get(key, getlink=True), h5py.HardLink):
            raise NIRError(f"node {name!r}: {key!r} is a link (to another file or place), which a NIR file has not")
        members.append((key, group[key]))
    return members


def _dataset(item: Any, where: str, budget: checks.Budget, strings: bool = False) -> Any:
    """A dataset's value, its size checked (and counted) before it is read; byte strings become str."""
    import h5py

    if not isinstance(item, h5py.Dataset):
        raise NIRError(f"{where}: missing")
    is_string = h5py.check_string_dtype(item.dtype) is not None or item.dtype.kind == "S"
    if not (is_string if strings else is_string or item.dtype.kind in "biuf"):
        raise NIRError(f"{where}: a dataset of {item.dtype}, not {'strings' if strings else 'numbers'}")
    budget.field(where, int(item.size) * max(1, item.dtype.itemsize // 8))
    value = item[()]
    if isinstance(value, bytes):
        return _text(value)
    return value


def _string(item: Any, where: str) -> str:
    import h5py

    if not isinstance(item, h5py.Dataset) or item.shape != () or item.dtype.itemsize > 256 or \
            h5py.check_string_dtype(item.dtype) is None and item.dtype.kind != "S":
        raise NIRError(f"{where}: expected one short string")
    return _text(item[()])


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf8")
        except UnicodeDecodeError:
            raise NIRError(f"a name or string that is not UTF-8: {value[:40]!r}") from None
    if isinstance(value, (str, np.str_)):
        return str(value)
    raise NIRError(f"expected a string, got {type(value).__name__}")
