"""The code fingerprint names every cached entry: it must change with what generates or runs kernels (the
GENERATOR table of autocuda/toolchain/store.py) and with nothing else, and every module of the package must be
classified."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autocuda.toolchain import store

PACKAGE = Path(store.__file__).resolve().parents[1]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the package (its templates inside it), to edit freely."""
    package = tmp_path / "autocuda"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package


def _append(path: Path, text: str = "\n# edited\n") -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize("name", ["tools/cli.py", "tools/testing/check.py", "nn/neuron.py", "call/functional.py",
                                  "runtime/reference.py", "base/errors.py", "new_helper.py"])
def test_editing_outside_the_generator_keeps_the_fingerprint(copy: Path, name: str) -> None:
    before = store.fingerprint(copy)
    path = copy / name
    _append(path) if path.exists() else path.write_text("X = 1\n")
    assert store.fingerprint(copy) == before


@pytest.mark.parametrize("name", ["toolchain/store.py", "codegen/dtypes.py", "spec/__init__.py",
                                  "codegen/__init__.py", "runtime/__init__.py", "runtime/neuron_launch.py",
                                  "toolchain/host/shim.h", "codegen/new_module.py"])
def test_editing_the_generator_changes_the_fingerprint(copy: Path, name: str) -> None:
    before = store.fingerprint(copy)
    path = copy / name
    _append(path) if path.exists() else path.write_text("X = 1\n")
    assert store.fingerprint(copy) != before


def test_editing_a_template_changes_the_fingerprint(copy: Path) -> None:
    before = store.fingerprint(copy)
    _append(next((copy / "codegen" / "templates").glob("*.j2")), "{# edited #}\n")
    assert store.fingerprint(copy) != before


def test_the_copy_has_the_installed_fingerprint(copy: Path) -> None:
    assert store.fingerprint(copy) == store.code_fingerprint.__wrapped__()  # uncached: this tree now


def _covered(path: str, entries: tuple[str, ...]) -> list[str]:
    return [entry for entry in entries if path == entry or path.startswith(f"{entry}/")]


def test_every_module_of_the_package_is_classified() -> None:
    """A new module fails here until a table covers it: an entry that is its path or a folder above it. Each
    module is covered by one entry of one table, and each entry covers a module."""
    modules = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))]
    entries = (*store.GENERATOR, *store.NOT_GENERATOR)
    assert [m for m in modules if len(_covered(m, entries)) != 1] == [], "in no table or in two entries"
    assert [e for e in entries if not any(_covered(m, (e,)) for m in modules)] == [], "listed but not in the package"
