"""How xdist shares the test files out (tests/conftest.py): a file is one unit of work, and the files that call
torch.compile are one unit together, so that one worker alone pays the first compile's set-up."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import COMPILE_FILES, COMPILE_SCOPE, schedule_scope

TESTS = Path(__file__).resolve().parent


def _calls_torch_compile(path: Path) -> bool:
    """Whether the file calls torch.compile (with any backend)."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"
               and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_the_compile_files_are_those_that_call_torch_compile() -> None:
    users = sorted(path.name for path in TESTS.glob("test_*.py") if _calls_torch_compile(path))
    assert users == sorted(COMPILE_FILES)


def test_the_scan_sees_torch_compile_calls(tmp_path: Path) -> None:
    cases = {"torch.compile(f)": True, "torch.compile(f, backend=name)": True, "torch.compile(f, mode='x')": True,
             "torch.compile(f, backend='aot_eager')": True, "re.compile('x')": False,
             "compile('1', 'f', 'eval')": False}
    for source, expected in cases.items():
        (tmp_path / "test_case.py").write_text(source + "\n")
        assert _calls_torch_compile(tmp_path / "test_case.py") is expected, source


def test_each_file_is_a_unit_and_the_compile_files_one_together() -> None:
    assert schedule_scope("tests/test_ops.py::test_a[x::y]") == "tests/test_ops.py"
    assert schedule_scope("tests/gpu/test_ops_gpu.py::test_b") == "tests/gpu/test_ops_gpu.py"
    assert {schedule_scope(f"tests/{name}::test_c") for name in COMPILE_FILES} == {COMPILE_SCOPE}
