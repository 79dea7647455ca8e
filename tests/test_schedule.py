"""How xdist shares the test files out (tests/conftest.py): a file is one unit of work, and the files that call
torch.compile or opcheck are one unit together, so that one worker alone pays the first compile's set-up."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import COMPILE_FILES, COMPILE_SCOPE, schedule_scope

TESTS = Path(__file__).resolve().parent


def _compiles(node: ast.AST) -> bool:
    """Whether the node is a call of torch.compile (with any backend; or of the benchmark's systems.compiled, which
    calls it) or of opcheck (torch.library's, by any name that ends in it)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return (func.attr, owner) in {("compile", "torch"), ("compiled", "systems")} or func.attr == "opcheck"
    return isinstance(func, ast.Name) and func.id == "opcheck"


def _calls_torch_compile(path: Path) -> bool:
    return any(map(_compiles, ast.walk(ast.parse(path.read_text(), str(path)))))


def test_the_compile_files_are_those_that_call_torch_compile_or_opcheck() -> None:
    users = sorted(path.name for path in TESTS.glob("test_*.py") if _calls_torch_compile(path))
    assert users == sorted(COMPILE_FILES)


def test_the_scan_sees_torch_compile_and_opcheck_calls(tmp_path: Path) -> None:
    cases = {"torch.compile(f)": True, "torch.compile(f, backend=name)": True, "torch.compile(f, mode='x')": True,
             "torch.compile(f, backend='aot_eager')": True, "torch.library.opcheck(op, args)": True,
             "opcheck(op, args)": True, "systems.compiled(case, backend='eager')": True, "re.compile('x')": False,
             "compile('1', 'f', 'eval')": False, "other.compiled(case)": False}
    for source, expected in cases.items():
        (tmp_path / "test_case.py").write_text(source + "\n")
        assert _calls_torch_compile(tmp_path / "test_case.py") is expected, source


def test_each_file_is_a_unit_and_the_compile_files_one_together() -> None:
    assert schedule_scope("tests/test_parse.py::test_a[x::y]") == "tests/test_parse.py"
    assert schedule_scope("tests/gpu/test_ops_gpu.py::test_b") == "tests/gpu/test_ops_gpu.py"
    assert {schedule_scope(f"tests/{name}::test_c") for name in COMPILE_FILES} == {COMPILE_SCOPE}
