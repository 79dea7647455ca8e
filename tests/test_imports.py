"""What importing autocuda costs: the public names of `autocuda.nn` are imported on first use, and none of them
needs the generator (sympy, jinja2), Dynamo or the optional tools (NIR, matplotlib, cupy).

The import checks share one new process (`python_children`: forked with torch imported, the first thing
`import autocuda` imports, and nothing of ours; a child interpreter costs more than all of them): it runs STEPS in turn
and records the WATCHED modules imported after each. A step only adds modules, so one absent after a step is
absent from a fresh process that runs that step alone: sharing the process can fail an absence check wrongly,
never pass it wrongly. The check that every public name resolves in a fresh import (FRESH) runs in a fork of that
process taken before the first step, where only torch is imported (the first thing `import autocuda` imports):
both share torch's import, and the fork has imported nothing of autocuda."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import python_children

import autocuda.nn

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("sympy", "jinja2", "nir", "nirtorch", "matplotlib", "cupy")
SJ_COMPAT = ("autocuda.nn.neuron", "autocuda.nn.spikingjelly", "autocuda.nn.spikingjelly_more",
             "autocuda.nn.spikingjelly_variants", "autocuda.nn.spikingjelly_levels", "autocuda.nn.batchnorm",
             "spikingjelly")
SJ_NEURONS = "spikingjelly.activation_based.neuron"
DYNAMO = "torch._dynamo"
WATCHED = (*HEAVY, *SJ_COMPAT, SJ_NEURONS, DYNAMO)
STEPS = {"autocuda.nn": "import autocuda, autocuda.nn",
         "FlexSN": "from autocuda.nn import FlexSN",
         "autocuda.call.functional": "import autocuda.call.functional",
         "every public name": "for name in autocuda.nn.__all__: getattr(autocuda.nn, name)"}


FRESH = ("import autocuda, types\n"
         "for name in (*autocuda.__all__, *autocuda._SUBMODULES):\n"
         "    value = getattr(autocuda, name)\n"
         "    assert name not in autocuda._SUBMODULES or isinstance(value, types.ModuleType), name\n"
         "autocuda.surrogate.Sigmoid()\n"
         "import autocuda.errors as alias, autocuda.base.errors as real\n"  # the import statement finds the same module
         "assert alias is real and real.__spec__.name == 'autocuda.base.errors'\n")


def _child_program() -> str:
    """Prints {"steps": step -> WATCHED modules imported by then, "fresh": FRESH's traceback or ""}: FRESH in a
    fork taken before the first step (its own process where the system cannot fork)."""
    lines = ["import json, os, subprocess, sys, traceback", "import torch", "found = {}",
             "if hasattr(os, 'fork'):",
             "    reader, writer = os.pipe()",
             "    pid = os.fork()",
             "    if pid == 0:",
             "        os.close(reader)",
             "        try:",
             f"            exec({FRESH!r}, {{}})",
             "            message = ''",
             "        except BaseException:",
             "            message = traceback.format_exc() or 'failed'",
             "        with os.fdopen(writer, 'w') as out:",
             "            out.write(message)",
             "        os._exit(0)",
             "    os.close(writer)"]
    for step, code in STEPS.items():
        lines += [code, f"found[{step!r}] = sorted(m for m in {WATCHED!r} if m in sys.modules)"]
    lines += ["if hasattr(os, 'fork'):",
              "    with os.fdopen(reader) as result:",
              "        fresh = result.read()",
              "    status = os.waitpid(pid, 0)[1]",
              "    fresh = fresh or ('' if status == 0 else f'the fork ended with status {status}')",
              "else:",
              f"    done = subprocess.run([sys.executable, '-c', {FRESH!r}], capture_output=True, text=True)",
              "    fresh = '' if done.returncode == 0 else done.stderr or 'failed'",
              "print(json.dumps({'steps': found, 'fresh': fresh}))"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def child() -> dict:
    """What the child process reports (`_child_program`)."""
    done = python_children.run(["-c", _child_program()], env=os.environ | {"PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def imported_after(child) -> dict[str, list[str]]:
    """Step -> the WATCHED modules a fresh process has imported once it has run STEPS up to that one."""
    return child["steps"]


def test_importing_autocuda_nn_imports_none_of_its_classes(imported_after):
    assert imported_after["autocuda.nn"] == []


def test_flexsn_needs_neither_the_spikingjelly_classes_nor_the_generator(imported_after):
    # SpikingJelly's `base` module alone, where it is installed (its MemoryModule is FlexSN's base, as Neuron's)
    assert set(imported_after["FlexSN"]) <= {"spikingjelly"}  # not its neurons (SJ_NEURONS, watched)


def test_importing_autocuda_imports_neither_sympy_nor_jinja(imported_after):
    assert not {"sympy", "jinja2", "cupy"} & set(imported_after["autocuda.call.functional"])


def test_importing_the_functional_api_does_not_import_dynamo(imported_after):
    assert DYNAMO not in imported_after["autocuda.call.functional"], \
        "importing Dynamo costs seconds in every fresh process"


def test_every_public_name_of_autocuda_nn_imports_nothing_heavy(imported_after):
    found = imported_after["every public name"]
    assert not set(found) & {*HEAVY, DYNAMO}, found
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
    # 29, then the noisy (6), ILC (4), few-spike (4), online (2), DSR (2) and conversion (2) names, and more
    assert len(set(autocuda.nn.__all__)) == len(autocuda.nn.__all__) >= 49


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LIFnode'"):
        autocuda.nn.LIFnode  # noqa: B018
    with pytest.raises(ImportError, match="LIFnode"):
        from autocuda.nn import LIFnode  # noqa: F401


def documented_modules() -> set[str]:
    """The public submodules the API pages document (`::: autocuda.X...` in docs/api): a module of a layer
    folder by its public name (`autocuda._ALIASES`)."""
    import autocuda

    public = {f"autocuda{real}": alias for alias, real in autocuda._ALIASES.items()}
    found = set()
    for page in (REPO / "docs").rglob("*.md"):
        for line in page.read_text().splitlines():
            if line.startswith("::: autocuda."):
                path = line.split()[1]
                home = [module for module in public if path == module or path.startswith(f"{module}.")]
                found.add(public[home[0]] if home else path.split(".")[1])
    return found


def test_every_public_submodule_and_name_is_an_attribute_of_a_fresh_import(child):
    import autocuda

    assert documented_modules() <= set(autocuda._SUBMODULES), "a documented module is missing from _SUBMODULES"
    assert child["fresh"] == "", child["fresh"]
