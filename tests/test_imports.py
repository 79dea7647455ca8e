"""What importing autocuda costs: the public names of `autocuda.nn` are imported on first use, and none of them
needs the generator (sympy, jinja2) or the optional tools (NIR, matplotlib). Each check runs in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autocuda.nn

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("sympy", "jinja2", "nir", "nirtorch", "matplotlib", "cupy")
SJ_COMPAT = ("autocuda.nn.neuron", "autocuda.nn.spikingjelly", "autocuda.nn.spikingjelly_more",
             "autocuda.nn.spikingjelly_variants", "autocuda.nn.spikingjelly_levels", "autocuda.nn.batchnorm",
             "spikingjelly")


def imported_after(code: str) -> list[str]:
    """The modules (of HEAVY and SJ_COMPAT) that a fresh process has imported after running `code`."""
    names = [*HEAVY, *SJ_COMPAT]
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {names!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], env=os.environ | {"PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_autocuda_nn_imports_none_of_its_classes():
    assert imported_after("import autocuda, autocuda.nn") == []


def test_flexsn_needs_neither_the_spikingjelly_classes_nor_the_generator():
    assert imported_after("from autocuda.nn import FlexSN") == []


def test_every_public_name_of_autocuda_nn_imports_nothing_heavy():
    found = imported_after("import autocuda.nn, autocuda.functional\n"
                           "for name in autocuda.nn.__all__: getattr(autocuda.nn, name)")
    assert not set(found) & set(HEAVY), found
    assert "autocuda.nn.batchnorm" in found, "the loop above must have imported every class"


def test_lazy_names_are_the_classes_of_their_modules():
    from autocuda.nn.batchnorm import fuse_batchnorm as fuse
    from autocuda.nn.flexsn import FlexSN as Flex
    from autocuda.nn.neuron import Neuron as Layer
    from autocuda.nn.spikingjelly_levels import ILIFNode as Levels

    star: dict = {}
    exec("from autocuda.nn import *", star)  # a star import goes through the lazy names too
    assert set(autocuda.nn.__all__) <= set(star)
    assert (star["Neuron"], star["FlexSN"], star["fuse_batchnorm"], star["ILIFNode"]) == (Layer, Flex, fuse, Levels)
    assert autocuda.nn.Neuron is Layer
    assert set(autocuda.nn.__all__) <= set(dir(autocuda.nn))
    assert len(set(autocuda.nn.__all__)) == len(autocuda.nn.__all__) == 26


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LIFnode'"):
        autocuda.nn.LIFnode  # noqa: B018
    with pytest.raises(ImportError, match="LIFnode"):
        from autocuda.nn import LIFnode  # noqa: F401
