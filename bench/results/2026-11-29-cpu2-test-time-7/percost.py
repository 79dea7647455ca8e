"""A pytest plugin for measuring only: CPU seconds (this process and its waited-for children) and host-runner
compiles per test file, written per xdist worker to $PERCOST_DIR (default /tmp) as percost-<tag>-<worker>.json.
Load it with `-p percost` (its folder on PYTHONPATH)."""
from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

_costs: dict[str, list[float]] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _compiled() -> int:
    from autocuda.toolchain.host import stats

    return stats["compiled"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu, compiled, wall = _cpu(), _compiled(), time.time()
    yield
    cost = _costs.setdefault(item.nodeid.split("::")[0], [0.0, 0, 0.0])
    cost[0] += _cpu() - cpu
    cost[1] += _compiled() - compiled
    cost[2] += time.time() - wall


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(os.environ.get("PERCOST_DIR", "/tmp"))
    (folder / f"percost-{os.environ.get('PERCOST_TAG', 'run')}-{worker}.json").write_text(json.dumps(_costs))
