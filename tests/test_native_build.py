"""The native library's build, without building it (a stand-in compiler writes a few bytes): a process never waits
on a build another process started (its calls take the Python path), `ensure()` alone waits, and `autocuda native`
/ `autocuda cache` say where the library stands; `autocuda native build` builds it ahead of time.

Another process holds the build lock here as a builder does (flock on the lock file, its id written there), until
the test lets it go: no test depends on how long anything takes."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from autocuda.call import native
from autocuda.toolchain.host import cache
from autocuda.toolchain.host import cxx as toolchain
from autocuda.tools.cli import main

pytestmark = pytest.mark.skipif(toolchain.missing_compiler() is not None, reason="no C++ compiler (the library's key "
                                "names it)")

WAITED = 120
T = TypeVar("T")
_HOLDER = ("import fcntl, os, sys\n"
           "handle = open(sys.argv[1], 'a+')\n"
           "fcntl.flock(handle, fcntl.LOCK_EX)\n"
           "handle.truncate(0); handle.write(str(os.getpid())); handle.flush()\n"
           "print('held', flush=True)\n"
           "sys.stdin.read()\n")


@contextlib.contextmanager
def lock_held_by_another_process() -> Iterator[int]:
    """A child process holding the build lock of this process's cache until the block ends; its id."""
    lock = cache.cache_dir() / native.LOCK_NAME
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield child.pid
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A fresh cache, and the builds made into it: a stand-in compiler writes a few bytes (no library)."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    made: list[Path] = []

    def compile_stand_in(output: Path) -> None:
        made.append(output)
        output.write_bytes(b"a stand-in for the native library")

    monkeypatch.setattr(native, "_compile", compile_stand_in)
    return made


@pytest.fixture
def unasked(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's native state as before its first ask (whatever earlier tests of the worker loaded)."""
    monkeypatch.setattr(native, "_state", {"phase": "unasked", "why": "", "path": ""})
    monkeypatch.setattr(native, "_builder", [])
    monkeypatch.setattr(native, "_CALL", None)


def returned(function: Callable[[], T]) -> T:
    """`function()`'s value, which must come without waiting for the other process (a bound of minutes, far above
    what a call that does not wait takes, so that a call that waits fails the test instead of hanging it)."""
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    thread.join(timeout=WAITED)
    assert result, f"it waited ({WAITED} s) for the other process"
    return result[0]


def libraries() -> list[Path]:
    return sorted(cache.cache_dir().glob("native-*.so"))


def test_a_build_another_process_runs_is_left_at_once(builds, capsys):
    with lock_held_by_another_process() as holder:
        assert returned(native.build_into_cache) == native.BUSY
        assert f"process {holder} is building the native library" in capsys.readouterr().err
        assert builds == [] and libraries() == []
    assert native.build_into_cache() == 0  # the lock free: built once
    assert native.build_into_cache() == 0  # then found
    assert len(builds) == 1 and len(libraries()) == 1


def test_a_process_whose_library_another_process_builds_takes_the_python_path(builds, unasked):
    """The first ask starts the helper (`python -m autocuda.native`), which leaves at once: no wait, no build."""
    with lock_held_by_another_process() as holder:
        assert not native.loaded()
        returned(lambda: [thread.join() for thread in native._builder])  # the helper's exit, not the other build's
        status = native.status()
        assert status.startswith("elsewhere: ") and f"process {holder} is building the native library" in status
        assert not native.loaded() and libraries() == []


def test_ensure_waits_for_a_build_another_process_started(builds, unasked, monkeypatch):
    """The one call that waits: it builds with wait=True (after the other build, the library is found)."""
    asked: list[bool] = []
    loads: list[Path] = []

    def build(wait: bool = False) -> int:
        asked.append(wait)
        cache.load_or_build(native._key(), native._compile)
        return 0

    native._state.update(phase="elsewhere", why="process 1 is building the native library")
    monkeypatch.setattr(native, "build_into_cache", build)
    monkeypatch.setattr(native, "_load", loads.append)
    native.ensure()
    assert asked == [True] and loads == libraries() and len(loads) == 1


def test_the_library_state_says_where_it_stands(builds, unasked, monkeypatch):
    state = native.library_state()
    assert state.state == "not built" and state.path is not None and state.path.parent == cache.cache_dir()
    assert "autocuda native build" in state.why
    with lock_held_by_another_process() as holder:
        state = native.library_state()
        assert state.state == "building" and f"process {holder}" in state.why
    native.build_into_cache()
    assert native.library_state().state == "built" and native.library_state().path == libraries()[0]
    monkeypatch.setattr(native, "USE", False)
    assert "AUTOCUDA_NATIVE=0" in native.library_state().why
    monkeypatch.setattr(native, "_CALL", object())
    native._state.update(path=str(libraries()[0]))
    assert str(native.library_state()).startswith(f"loaded ({libraries()[0]})")
    monkeypatch.setattr(native, "_CALL", None)
    monkeypatch.setattr(toolchain, "missing_compiler", lambda: "no compiler here")
    assert str(native.library_state()) == "unavailable: no compiler here; calls take the Python path"


def test_the_state_looks_without_making_the_cache(tmp_path, unasked, monkeypatch):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    assert native.library_state().state == "not built"
    assert not (tmp_path / "cache" / "host").exists()


def test_the_command_builds_ahead_of_time_and_reports(builds, unasked, capsys):
    assert main(["native"]) == 0
    assert capsys.readouterr().out.startswith("native library: not built (")
    with lock_held_by_another_process() as holder:
        assert returned(lambda: main(["native", "build"])) == 1
        ran = capsys.readouterr()
        assert f"process {holder} is building" in ran.err and ran.out == "" and builds == []
    assert main(["native", "build"]) == 0
    assert capsys.readouterr().out == f"native library: built ({libraries()[0]}): a process's first CUDA call " \
        f"loads it{'' if native.USE else '; the native path is off in this process (AUTOCUDA_NATIVE=0)'}\n"
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["host", "1"] for line in out.splitlines())
    assert f"native library: built ({libraries()[0]})" in out

