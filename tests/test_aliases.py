"""The package's public module names keep working now that each module lives in its layer folder
(autocuda.base.aliases): an alias is the module of its real name, for imports, attributes, pickles, `python -m`
and the console script. (A fresh process's imports through the aliases: tests/test_imports.py.)"""
from __future__ import annotations

import importlib
import pickle
import re
import runpy
import sys
from pathlib import Path

import pytest

import autocuda
from autocuda.base import aliases
from autocuda.base.aliases import AliasFinder

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("alias", sorted(autocuda._ALIASES))
def test_an_alias_is_the_module_of_its_real_name(alias: str) -> None:
    real = importlib.import_module(f"autocuda{autocuda._ALIASES[alias]}")
    assert importlib.import_module(f"autocuda.{alias}") is real
    assert getattr(autocuda, alias) is real
    assert real.__name__ == real.__spec__.name == f"autocuda{autocuda._ALIASES[alias]}"  # its own spec kept


def test_names_imported_through_an_alias_are_the_real_ones() -> None:
    import autocuda.surrogate
    from autocuda.surrogate import ATan as aliased
    from autocuda.testing.cases import make_case  # a module under an aliased package

    import autocuda.tools.testing.cases
    from autocuda.spec.surrogate import ATan

    assert aliased is ATan and autocuda.surrogate.ATan is ATan and ATan.__module__ == "autocuda.spec.surrogate"
    assert make_case is autocuda.tools.testing.cases.make_case
    assert sys.modules["autocuda.testing.cases"] is autocuda.tools.testing.cases


def test_every_public_submodule_that_moved_has_an_alias() -> None:
    moved = {name for name in autocuda._SUBMODULES if not (Path(autocuda.__file__).parent / name).is_dir()}
    assert moved <= set(autocuda._ALIASES)
    assert {"native", "cli"} <= set(autocuda._ALIASES)  # `python -m autocuda.native`, `autocuda.cli:main`


def test_a_pickle_that_names_the_old_module_loads() -> None:
    from autocuda.spec.surrogate import ATan

    old = pickle.dumps(ATan(alpha=3.0), protocol=0).replace(b"autocuda.spec.surrogate", b"autocuda.surrogate")
    assert b"autocuda.surrogate\n" in old
    loaded = pickle.loads(old)
    assert type(loaded) is ATan and loaded == ATan(alpha=3.0)


def test_an_unknown_name_under_an_alias_is_not_found() -> None:
    with pytest.raises(ModuleNotFoundError, match="autocuda.nir.no_such_module"):
        importlib.import_module("autocuda.nir.no_such_module")
    with pytest.raises(ModuleNotFoundError, match="autocuda.no_such_module"):
        importlib.import_module("autocuda.no_such_module")


def test_the_finder_maps_only_its_aliases() -> None:
    finder = AliasFinder({"pkg.old": "pkg.layer.new"})
    assert finder.real_name("pkg.old") == "pkg.layer.new"
    assert finder.real_name("pkg.old.sub") == "pkg.layer.new.sub"
    assert finder.real_name("pkg.older") is None and finder.real_name("pkg") is None
    assert finder.find_spec("other.module") is None


def test_installing_the_table_again_adds_no_finder() -> None:
    table = {f"autocuda.{alias}": f"autocuda{real}" for alias, real in autocuda._ALIASES.items()}
    before = list(sys.meta_path)
    assert aliases.install(table) in before
    assert sys.meta_path == before and sum(isinstance(f, AliasFinder) for f in sys.meta_path) == 1


@pytest.mark.parametrize("module, argv, expected", [("autocuda.native", ["--help"], "[--wait]"),
                                                    ("autocuda", ["--version"], f"autocuda {autocuda.__version__}")])
def test_python_dash_m_runs_through_an_alias(module, argv, expected, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # what `python -m` runs
    assert done.value.code == 0
    assert expected in capsys.readouterr().out


def test_the_console_script_and_its_old_target_resolve() -> None:
    found = re.search(r'^autocuda = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml has no `autocuda` script"
    target = found.group(1)
    module, _, name = target.partition(":")
    main = getattr(importlib.import_module(module), name)
    assert main is importlib.import_module("autocuda.cli").main  # an install made before the move
