"""The `autocuda` command: list, show, new + check, cache, version, one-line errors (the benchmark, `python -m bench`:
tests/test_benchmark.py).

Most tests call `main` in this process (output captured, so not a terminal: as in a user's pipeline); one runs
the module in a child process, as the installed entry point does."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import python_children
from conftest import first_arch_by_default

from autocuda import __version__
from autocuda.spec.load import list_specs
from autocuda.tools.cli import main


def autocuda(*args: str) -> subprocess.CompletedProcess:
    """The installed entry point's code in a child process, output piped (as a user's shell pipeline)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return python_children.run(["-m", "autocuda.tools.cli", *args], env=env)


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`autocuda ARGS` run by `main` in this process: its exit status (argparse's exits included) and output."""
    def run(*args: str) -> Ran:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        out, err = capsys.readouterr()
        return Ran(code, out, err)
    return run


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"autocuda {__version__}"


def test_list_names_every_shipped_spec_with_its_doc(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, doc in list_specs():
        assert any(line.split()[0] == name and doc in line for line in out.splitlines()), name


def test_show_prints_plain_compilable_source_when_piped(nvcc, cli):
    result = cli("show", "lif", "--kernel", "bptt", "--dtype", "float16")
    assert result.returncode == 0, result.stderr
    source = result.stdout
    assert "\x1b[" not in source, "escape codes in piped output"
    assert 'extern "C" __global__ void lif_bptt_float16' in source
    assert nvcc({"lif bptt float16": source}, archs=first_arch_by_default()) == {}


def test_show_and_check_a_spec_with_several_inputs(capsys):
    """The shipped conductance LIF: `show` prints a kernel reading each input, `check` runs it (the tour does
    as `check --quick` does, for every shipped spec)."""
    assert main(["show", "conductance_lif", "--kernel", "bptt"]) == 0
    source = capsys.readouterr().out
    assert all(f"usr_{u}_seq" in source and f"usr_grad_{u}_seq" in source for u in ("g_e", "g_i"))
    assert main(["check", "conductance_lif", "--backend", "host", "--quick"]) == 0
    assert "pass" in capsys.readouterr().out


def test_new_writes_a_skeleton_that_check_passes(tmp_path: Path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    made = cli("new", "mymodel")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "mymodel.toml").is_file()
    shown = cli("show", "mymodel.toml", "--kernel", "fptt")
    assert shown.returncode == 0 and "mymodel_fptt_float32" in shown.stdout, shown.stderr
    checked = cli("check", "mymodel.toml", "--backend", "host", "--quick")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "pass" in checked.stdout and "FAIL" not in checked.stdout


def test_new_refuses_to_overwrite_and_refuses_bad_names(tmp_path: Path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    assert cli("new", "mymodel").returncode == 0
    again = cli("new", "mymodel")
    assert again.returncode == 2 and "exists" in again.stderr
    assert cli("new", "mymodel", "--force").returncode == 0
    bad = cli("new", "__global__")
    assert bad.returncode == 2 and "__global__" in bad.stderr


def assert_one_line_error(result: Ran | subprocess.CompletedProcess, words: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocuda: error:") and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_entry_point_exits_with_one_line_error():
    """In a new process (`python_children`: torch imported, autocuda not): nothing else (an import-time warning of
    ours, say) reaches stderr."""
    assert_one_line_error(autocuda("show", "no_such_spec"), "no_such_spec")


@pytest.mark.parametrize("args, words", [
    (("show", "no_such_spec"), "no_such_spec"),
    (("check",), "--all"),
    (("show", "missing.toml"), "missing.toml"),
])
def test_errors_are_one_line_without_a_traceback(args, words, cli):
    assert_one_line_error(cli(*args), words)


def test_an_error_without_text_is_named_by_its_class(monkeypatch, cli):
    """A MemoryError (no text) printed an empty `autocuda: error:`."""
    def exhausted(name: str) -> None:
        raise MemoryError()
    monkeypatch.setattr("autocuda.tools.cli.spec_argument", exhausted)
    assert_one_line_error(cli("show", "lif"), "autocuda: error: MemoryError")


def test_debug_shows_the_traceback(cli):
    from autocuda import SpecError

    with pytest.raises(SpecError, match="no_such_spec"):  # uncaught: the interpreter prints its traceback
        cli("--debug", "show", "no_such_spec")


def test_progress_bar_only_on_a_terminal(capsys, monkeypatch):
    from autocuda.base.progress import progress

    monkeypatch.delenv("AUTOCUDA_PROGRESS", raising=False)
    assert list(progress(["lif", "qif"], desc="check")) == ["lif", "qif"]
    assert capsys.readouterr().err == "", "piped stderr gets no progress bar"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain bar
    assert list(progress(["lif", "qif", "eif", "izh"], desc="check")) == ["lif", "qif", "eif", "izh"]
    err = capsys.readouterr().err
    assert "1/4 check" in err and "[" + "#" * 7 + "." * 23 + "]" in err


def test_cache_shows_and_clears_what_is_stored(tmp_path, monkeypatch, capsys):
    from autocuda.toolchain import store

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    assert main(["cache"]) == 0
    assert "(empty)" in capsys.readouterr().out
    store.save("kernels", "a", b"{}")
    store.save("binaries", "b", b"\0" * 4096)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out
    assert any(line.split()[:2] == ["kernels", "1"] for line in out.splitlines())
    assert any(line.split()[:2] == ["binaries", "1"] for line in out.splitlines())
    assert main(["cache", "--clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert store.usage() == [] and store.read("kernels", "a") is None


def test_cache_counts_a_file_stored_under_several_names_once(tmp_path, monkeypatch):
    """A host group's library is linked under each of its kernels' keys (`store.write_name`): its bytes count once."""
    from autocuda.toolchain import store

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    data = b"\0" * 8192
    store.save("host", "first", data)
    first = store.folder("host") / "first"
    for name in ("second", "third"):
        store.write_name(store.folder("host") / name, first, data)
    linked = first.stat().st_nlink == 3  # a file system that takes no links gets copies: their bytes count each
    assert dict((kind, (n, size)) for kind, n, size in store.usage()) == {"host": (3, len(data) * (1 if linked else 3))}
    assert all(store.read("host", name) == data for name in ("first", "second", "third"))


def test_new_accepts_exactly_the_names_a_spec_may_have(tmp_path: Path, capsys) -> None:
    """`new` and `show` follow one rule (spec/names.py): a 64-character name works end to end, 65 is refused."""
    from autocuda.spec.names import MAX_SPEC_NAME

    longest = "n" * MAX_SPEC_NAME
    assert main(["new", str(tmp_path / longest)]) == 0
    assert main(["show", str(tmp_path / f"{longest}.toml")]) == 0
    assert "__global__" in capsys.readouterr().out
    assert main(["new", str(tmp_path / (longest + "n"))]) == 2
    assert f"{MAX_SPEC_NAME} characters at most" in capsys.readouterr().err
    assert not (tmp_path / f"{longest}n.toml").exists()


def test_a_bad_file_name_does_not_hide_the_specs_own_mistake(tmp_path: Path) -> None:
    """Without a `name` field the stem names the spec: a stem that cannot is reported with the real mistake."""
    from autocuda import SpecError, load_spec

    body = 'charge = "v + x / tau_m"\n[params]\ntau = 2.0\nv_threshold = 1.0\nv_reset = 0.0\n[states]\nv = 0.0\n'
    path = tmp_path / "my-neuron.toml"
    path.write_text(body)
    with pytest.raises(SpecError, match="unknown name 'tau_m'.*field 'name': the file name 'my-neuron'") as error:
        load_spec(path)
    assert error.value.field == "charge" and error.value.symbol == "tau_m"
    path.write_text(body.replace("tau_m", "tau"))
    with pytest.raises(SpecError, match="the file name 'my-neuron' .* add name = ") as error:
        load_spec(path)
    assert error.value.field == "name"
    path.write_text('name = "mine"\n' + body.replace("tau_m", "tau"))
    assert load_spec(path).name == "mine"


def test_backend_cuda_without_cuda_says_what_to_do(monkeypatch, capsys) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command in (["check", "lif", "--backend", "cuda"], ["tour", "--backend", "cuda"]):
        assert main(command) == 2
        error = capsys.readouterr().err
        assert "--backend cuda" in error and "--backend host" in error and "Torch not compiled" not in error


def test_every_option_and_argument_has_help() -> None:
    from autocuda.tools.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"autocuda {name} {action.option_strings or action.dest} has no help"


def test_a_reader_that_leaves_ends_the_command_quietly(monkeypatch, capsys):
    """`autocuda tour | head -1`: stdout's reader gone, the command said `autocuda: error: [Errno 32] Broken pipe`;
    it stops with status 1 and says nothing, as Unix tools do."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as gone:
        monkeypatch.setattr(sys, "stdout", gone)
        assert main(["list"]) == 1
        monkeypatch.undo()
    assert "Broken pipe" not in capsys.readouterr().err
