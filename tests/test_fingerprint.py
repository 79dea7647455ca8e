"""The code fingerprint names every cached entry: it must change with what generates or runs kernels (the
GENERATOR table of autocuda/store.py) and with nothing else, and every module of the package must be classified."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autocuda import store
from autocuda.resources import resource_dir

PACKAGE = Path(store.__file__).resolve().parent


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the package and its templates: (package, templates), to edit freely."""
    package, templates = tmp_path / "autocuda", tmp_path / "templates"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(resource_dir("templates"), templates)
    return package, templates


def _append(path: Path, text: str = "\n# edited\n") -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize("name", ["cli.py", "testing/check.py", "nn/neuron.py", "functional.py", "new_helper.py"])
def test_editing_outside_the_generator_keeps_the_fingerprint(copy: tuple[Path, Path], name: str) -> None:
    before = store.fingerprint(*copy)
    path = copy[0] / name
    _append(path) if path.exists() else path.write_text("X = 1\n")
    assert store.fingerprint(*copy) == before


@pytest.mark.parametrize("name", ["store.py", "dtypes.py", "spec/__init__.py", "codegen/__init__.py",
                                  "runtime/__init__.py", "host/shim.h", "codegen/new_module.py"])
def test_editing_the_generator_changes_the_fingerprint(copy: tuple[Path, Path], name: str) -> None:
    before = store.fingerprint(*copy)
    path = copy[0] / name
    _append(path) if path.exists() else path.write_text("X = 1\n")
    assert store.fingerprint(*copy) != before


def test_editing_a_template_changes_the_fingerprint(copy: tuple[Path, Path]) -> None:
    before = store.fingerprint(*copy)
    _append(next(copy[1].glob("*.j2")), "{# edited #}\n")
    assert store.fingerprint(*copy) != before


def test_the_copy_has_the_installed_fingerprint(copy: tuple[Path, Path]) -> None:
    assert store.fingerprint(*copy) == store.code_fingerprint.__wrapped__()  # uncached: this tree now


def test_every_module_of_the_package_is_classified() -> None:
    """A new module or subpackage fails here until it is in store.GENERATOR or store.NOT_GENERATOR."""
    modules = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    generator, other = set(store.GENERATOR), set(store.NOT_GENERATOR)
    assert not generator & other, "in both tables"
    assert modules - generator - other == set(), "unclassified: add them to GENERATOR or NOT_GENERATOR"
    assert (generator | other) - modules == set(), "listed but not in the package"
