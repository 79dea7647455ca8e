"""Python child processes for tests whose subject is another process (the CLI's entry point, a build left to finish, a
cache read by a new process, DDP's ranks) but not a fresh interpreter's start: they are forked from a server that
has imported torch, so each skips torch's import (a second of CPU a child). What the child runs, its arguments,
environment, working folder, streams and exit status are a `python` command's. Tests of what a process imports on
its own (tests/test_imports.py) or of how long its first use takes start real interpreters.

A child differs from `python ARGS` in what the server did before forking: torch (and what torch imports, not
sympy) is in sys.modules, and the interpreter's start-up options and variables (PYTHONPATH aside, which sets
sys.path as Python does) are the server's.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

_PRELOAD = ["torch", __name__]


class Child:
    """A forked child, as much of `subprocess.Popen` as the tests use (its streams go to files, read at the end)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None, cwd: str | os.PathLike | None):
        self.args = [sys.executable, *args]
        self._folder = tempfile.TemporaryDirectory(prefix="autocuda-child-")
        self._out, self._err = (Path(self._folder.name) / name for name in ("stdout", "stderr"))
        environment = dict(os.environ if env is None else env)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        self._process = context.Process(target=_run, args=(list(args), environment, str(cwd or os.getcwd()),
                                                           _sys_path(environment), str(self._out), str(self._err)))
        # multiprocessing would run the parent's __main__ again in the child (pytest's, under `python -m pytest`)
        main, sys.modules["__main__"] = sys.modules["__main__"], types.ModuleType("__main__")
        try:
            self._process.start()
        finally:
            sys.modules["__main__"] = main
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once the child has ended (TimeoutExpired if it has not within `timeout`)."""
        self.wait(timeout)
        try:
            return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")
        finally:
            self._folder.cleanup()


def run(args: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        timeout: float | None = 600, check: bool = False) -> subprocess.CompletedProcess:
    """`python ARGS` as `subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)` gives it."""
    child = Child(args, env, cwd)
    try:
        out, err = child.communicate(timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    done = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    if check:
        done.check_returncode()
    return done


_BASE_PATH: dict[str, list[str]] = {}


def _sys_path(env: Mapping[str, str]) -> list[str]:
    """sys.path after the interpreter's start, less its first entry (the script's folder, or '' for -c and -m):
    PYTHONPATH's folders, then the installation's (asked of a real interpreter once)."""
    if "" not in _BASE_PATH:
        bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        found = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                               env=bare, capture_output=True, text=True, check=True)
        _BASE_PATH[""] = json.loads(found.stdout)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [str(Path(p).absolute()) for p in extra] + _BASE_PATH[""]


def _run(args: list[str], env: dict[str, str], cwd: str, path: list[str], out: str, err: str) -> None:
    """In the child: streams, environment, folder and sys.path set as `python ARGS` has them, then ARGS run; ends
    the process with the exit status Python's would have, after the atexit functions."""
    for fd, name, mode in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(name, mode, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    code = 0
    try:
        if args[0] == "-c":
            sys.argv, sys.path[:] = ["-c", *args[2:]], ["", *path]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv, sys.path[:] = [args[1], *args[2:]], [cwd, *path]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[:] = list(args), [str(Path(args[0]).resolve().parent), *path]
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)

