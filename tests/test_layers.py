"""Each folder of the package is one layer; imports point down the layers, and no two modules import each other,
even through function-level or type-only imports.

Every import statement of the package counts, at module level, inside a function or under `if TYPE_CHECKING:`
(an import that never runs is still a module that knows another). A module's layer is its top folder's place in
`LAYERS` (a subfolder belongs to its parent's layer; the package's own `__init__` and `__main__` are above every
folder); a module may import modules of its own layer or below, and the whole graph has no cycle.
"""
from __future__ import annotations

import ast
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autocuda"

# The package's folders, lowest layer first. Lower layers know nothing of higher ones.
LAYERS: tuple[str, ...] = (
    "base",  # 0 foundation: errors, lazy imports, the public module aliases, where the data folders are, progress
    "spec",  # 1 the description of a neuron, its expression language, its derivation, the surrogates (no CUDA,
    #          no disk cache)
    "toolchain",  # 2 CUDA text compiled and launched, knowing no neuron: NVRTC, the driver, the host runner (host/),
    #               the disk cache, C naming facts, the C text builder
    "codegen",  # 3 dtypes, printers, templates, the builder DSL (ckernel, cfunction), spec -> kernel source
    "runtime",  # 4 neuron kernels on tensors (records, layouts, configurations) and the torch reference of a step
    "call",  # 5 a call on tensors: custom ops, the native operator, programs, the functional API, encoders
    "nn",  # 6 the layers (torch modules)
    "tools",  # 7 the command line, NIR, the kernel checks (testing), monitors and plots
)
ROOT_MODULES = ("autocuda", "autocuda.__main__")  # the package itself (wires the spec layer's hooks): on top


def layer_table(folders: tuple[str, ...] = LAYERS, package: str = "autocuda") -> dict[str, int]:
    """Module prefix -> layer: each folder its place, the package's own modules above them all."""
    return {**{f"{package}.{folder}": place for place, folder in enumerate(folders)},
            **dict.fromkeys(ROOT_MODULES, len(folders))}


LAYER_OF = layer_table()

Graph = Mapping[str, set[str]]


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str, layers: Mapping[str, int] = LAYER_OF) -> int:
    """The layer of the longest prefix of `module` in `layers`."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = layers.get(".".join(parts[:end]))
        if found is not None:
            return found
    raise KeyError(f"{module} has no layer: put it in a folder of LAYERS")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions, `if TYPE_CHECKING:` blocks)."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        yield candidate if candidate in known else base


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (module and function level)."""
    paths = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    known = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {target for node in _import_nodes(tree)
                   for target in _imported(node, module, path.name == "__init__.py", known)}
        graph[module] = {t for t in targets if t in known and t != module}
    return graph


def upward_edges(graph: Graph, layers: Mapping[str, int] = LAYER_OF) -> list[str]:
    return sorted(f"{a} (layer {layer(a, layers)}) imports {b} (layer {layer(b, layers)})"
                  for a, targets in graph.items() for b in targets if layer(b, layers) > layer(a, layers))


def cycle(graph: Graph) -> list[str] | None:
    """One cycle of the graph as a path (its first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def package_graph() -> Graph:
    """autocuda's import graph (parsed when a test asks for it, not when the file is collected)."""
    return import_graph()


def test_every_module_has_a_layer(package_graph):
    """Each module is in a layer folder, or is the package's own __init__ or __main__."""
    unplaced = [m for m in package_graph if m not in ROOT_MODULES and m.split(".")[1] not in LAYERS]
    assert not unplaced


def test_each_folder_is_a_layer():
    """The package's top level holds its layer folders and its own two modules, nothing else; every layer a
    folder."""
    # a folder without Python files is none of the package's (one a checkout left with only caches in it)
    entries = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py")))}
    assert entries == {*LAYERS, "__init__.py", "__main__.py"}
    assert all((PACKAGE / folder / "__init__.py").is_file() for folder in LAYERS)


def test_imports_point_down_the_layers(package_graph):
    assert upward_edges(package_graph) == []


# Import edges left out of the cycle check, each a known cycle to be removed (none left: issue 44's call-path
# redesign removed nn.layer_call's import of nn.neuron).
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


def without_edges(graph: Graph, edges: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {a: {b for b in targets if (a, b) not in edges} for a, targets in graph.items()}


def test_no_import_cycle(package_graph):
    assert cycle(without_edges(package_graph, KNOWN_CYCLE_EDGES)) is None


def test_each_known_cycle_edge_still_exists_and_closes_a_cycle(package_graph):
    """An exception that no longer applies must leave the list (so the list only shrinks)."""
    for a, b in KNOWN_CYCLE_EDGES:
        assert b in package_graph[a]
        assert cycle({m: t for m, t in package_graph.items() if m in (a, b)}) is not None


def test_the_spec_layer_knows_no_cuda_and_no_disk_cache(package_graph):
    spec = LAYER_OF["autocuda.spec"]
    spec_modules = [m for m in package_graph if layer(m) == spec]
    assert spec_modules and all(layer(t) <= spec for m in spec_modules for t in package_graph[m])


def test_the_graph_sees_function_level_and_relative_imports(package_graph):
    assert "autocuda.codegen.kernels" in package_graph["autocuda.runtime.neuron_launch"]  # imported inside a method
    assert "autocuda.spec.hooks" in package_graph["autocuda.spec.model"]  # `from . import domain, hooks`
    assert "autocuda.toolchain.host" in package_graph["autocuda.codegen.ckernel"]
    assert "autocuda.spec.parsed" in package_graph["autocuda.spec.model"]


def test_type_only_imports_count(tmp_path):
    root = tmp_path / "autocuda"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (root / "b.py").write_text("from . import a\n")
    graph = import_graph(root)
    assert graph["autocuda.a"] == {"autocuda.b"}
    assert cycle(graph) is not None


FAKE_LAYERS = {"p.low": 0, "p.mid": 1, "p.high": 2}


@pytest.mark.parametrize("graph, upward, has_cycle", [
    ({"p.low": set(), "p.mid": {"p.low"}, "p.high": {"p.mid", "p.low"}}, [], False),
    ({"p.low": {"p.high"}, "p.mid": set(), "p.high": set()}, ["p.low (layer 0) imports p.high (layer 2)"], False),
    ({"p.low": set(), "p.mid": {"p.mid.a"}, "p.mid.a": {"p.mid.b"}, "p.mid.b": {"p.mid"}, "p.high": set()},
     [], True),
])
def test_the_checks_can_fail(graph, upward, has_cycle):
    assert upward_edges(graph, FAKE_LAYERS) == upward
    assert (cycle(graph) is not None) == has_cycle


def test_a_module_takes_its_top_folders_layer():
    assert layer("autocuda.toolchain.host.runner") == layer("autocuda.toolchain") == LAYERS.index("toolchain")
    assert layer("autocuda") == layer("autocuda.__main__") == len(LAYERS)
    with pytest.raises(KeyError, match="autocuda_other.x has no layer"):
        layer("autocuda_other.x")


def test_a_cycle_is_reported_as_a_path():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_relative_imports_resolve(tmp_path):
    root = tmp_path / "autocuda"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "low.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from . import mod\n")
    (root / "sub" / "mod.py").write_text("def f():\n    from ..low import x\n    from .. import low\n")
    assert import_graph(root) == {"autocuda": set(), "autocuda.low": set(), "autocuda.sub": {"autocuda.sub.mod"},
                                  "autocuda.sub.mod": {"autocuda.low"}}


# -- one base for every error ----------------------------------------------------------------------------------
# Exception classes that are not errors a caller sees: raised and caught inside one module.
INTERNAL_EXCEPTIONS = {("autocuda.spec.budget", "_Interrupted"),  # a BaseException that no `except Exception` eats
                       ("autocuda.spec.reads", "_Unsafe")}  # a value with no safe key: caught where raised


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every class of the package whose base is named like an exception or a warning."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in getattr(node, "bases", ())]
            if isinstance(node, ast.ClassDef) and any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
                found.append((module_name(path), node.name))
    return found


def test_every_error_class_derives_from_one_base():
    import importlib

    from autocuda.base.errors import AutocudaError

    classes = [c for c in _exception_classes() if c not in INTERNAL_EXCEPTIONS]
    assert len(classes) >= 10
    strays = [f"{m}.{c}" for m, c in classes if not issubclass(getattr(importlib.import_module(m), c), AutocudaError)]
    assert strays == []


def test_errors_keep_their_builtin_bases():
    from autocuda.base import errors

    expected = {"SpecError": ValueError, "ConstantRangeError": errors.SpecError, "LiteralError": ValueError,
                "PrintError": ValueError,
                "RecordError": ValueError, "KernelArgumentError": TypeError, "CompileError": RuntimeError,
                "NvrtcError": RuntimeError, "DriverError": RuntimeError, "UnsafeCachePath": OSError,
                "CacheWarning": UserWarning}
    assert {name: issubclass(getattr(errors, name), base) for name, base in expected.items()} == \
        dict.fromkeys(expected, True)
    assert set(expected) < set(errors.__all__)
    # a SpecError's class survives pickling (xdist, multiprocessing) and relocation (`with_source`)
    error = errors.ConstantRangeError("too large", source="a.toml", field="params", symbol="g")
    for copy in (pickle.loads(pickle.dumps(error)), error.with_source("b.toml")):
        assert type(copy) is errors.ConstantRangeError and copy.field == "params" and copy.symbol == "g"


# -- one name, one thing ------------------------------------------------------------------------------------------
# Files every package may have one of: they are no module's own name.
PACKAGE_FILES = {"__init__.py", "__main__.py"}


def shared_file_names(package: Path = PACKAGE) -> dict[str, list[str]]:
    """File name -> the modules that have it, for each name more than one module of the package has."""
    owners: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name not in PACKAGE_FILES:
            owners.setdefault(path.name, []).append(module_name(path, package))
    return {name: modules for name, modules in owners.items() if len(modules) > 1}


def shared_class_names(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Public class name -> the modules that define one so named, for each name defined more than once (classes
    at a module's top level, or under an `if` there; a name starting with `_` is private)."""
    owners: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                owners.setdefault(node.name, []).append(module_name(path, package))
    return {name: modules for name, modules in owners.items() if len(modules) > 1}


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)


def test_no_two_modules_share_a_file_name():
    assert shared_file_names() == {}


def test_no_two_public_classes_share_a_name():
    assert shared_class_names() == {}


def test_shared_names_are_found(tmp_path):
    root = tmp_path / "autocuda"
    for folder in ("a", "b"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "plans.py").write_text("class Plan:\n    pass\n\n\nclass _Private:\n    pass\n")
    (root / "b" / "plans.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    class Plan: ...\n"
                                         "class _Private:\n    pass\n")
    (root / "b" / "other.py").write_text("def f():\n    class Plan:\n        pass\n")  # a local class: no export
    assert shared_file_names(root) == {"plans.py": ["autocuda.a.plans", "autocuda.b.plans"]}
    assert shared_class_names(root) == {"Plan": ["autocuda.a.plans", "autocuda.b.plans"]}
