"""A pytest plugin: each test's CPU time (the process's and its waited-for children's) and wall time, written per
xdist worker to $PERCOST_OUT-<worker>.json. `PYTHONPATH=<this folder> python -m pytest -n auto -p percost`."""
import json
import os
import resource
import time

import pytest

_rows: dict[str, tuple[float, float]] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _rows[item.nodeid] = (round(_cpu() - cpu, 3), round(time.perf_counter() - wall, 3))


def pytest_sessionfinish(session):
    out = os.environ.get("PERCOST_OUT")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{out}-{worker}.json", "w") as f:
            json.dump({"rows": _rows, "total_cpu": _cpu()}, f)
