"""How xdist shares the test files out (tests/conftest.py): a file is one unit of work, and the files that compile
with Inductor are one unit together, so that one worker alone pays Inductor's first-compile set-up."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import INDUCTOR_FILES, INDUCTOR_SCOPE, schedule_scope

TESTS = Path(__file__).resolve().parent
NOT_INDUCTOR = {"eager", "aot_eager"}  # torch.compile backends that generate no code


def _compiles_with_inductor(path: Path) -> bool:
    """Whether the file calls torch.compile with a backend that is not literally one of NOT_INDUCTOR (none given is
    Inductor; a backend chosen at run time may be)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            backend = next((k.value for k in node.keywords if k.arg == "backend"), None)
            if not (isinstance(backend, ast.Constant) and backend.value in NOT_INDUCTOR):
                return True
    return False


def test_the_inductor_files_are_those_that_compile_with_inductor() -> None:
    users = sorted(path.name for path in TESTS.glob("test_*.py") if _compiles_with_inductor(path))
    assert users == sorted(INDUCTOR_FILES)


def test_the_scan_sees_inductor_calls(tmp_path: Path) -> None:
    cases = {"torch.compile(f)": True, "torch.compile(f, backend=name)": True, "torch.compile(f, mode='x')": True,
             "torch.compile(f, backend='aot_eager')": False, "torch.compile(f, backend='eager')": False,
             "re.compile('x')": False}
    for source, expected in cases.items():
        (tmp_path / "test_case.py").write_text(source + "\n")
        assert _compiles_with_inductor(tmp_path / "test_case.py") is expected, source


def test_each_file_is_a_unit_and_the_inductor_files_one_together() -> None:
    assert schedule_scope("tests/test_ops.py::test_a[x::y]") == "tests/test_ops.py"
    assert schedule_scope("tests/gpu/test_ops_gpu.py::test_b") == "tests/gpu/test_ops_gpu.py"
    assert {schedule_scope(f"tests/{name}::test_c") for name in INDUCTOR_FILES} == {INDUCTOR_SCOPE}
